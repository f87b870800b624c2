"""The raw limit: redis-py + hiredis calling one minimal Lua script per operation.

Each script does the same data movement as the corresponding backend
operation on the same storage model (one lex-ordered ``pending`` sorted set
of ``"<queue> <19-digit id>"`` members, a ``bodies`` hash, a queue registry,
a wake-up ``PUBLISH``), but nothing else: no namespace or key-type checks,
no claimed/vacuum bookkeeping, no delivery counts, no clock. It is what one
round trip through redis-py costs on this machine, and every backend rate is
reported as a ratio to it.

Scripts are short module constants registered once (redis-py's
``register_script``: EVALSHA, reloaded on NOSCRIPT), like ``redis/lock.py``.
Every key arrives in ``KEYS``: 1 seq, 2 bodies, 3 pending, 4 registry,
5 reserved. ARGV[1] is always the wake-up channel prefix.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import redis

_PRELUDE = """
local K_SEQ, K_BODIES, K_PENDING = KEYS[1], KEYS[2], KEYS[3]
local K_REGISTRY, K_RESERVED = KEYS[4], KEYS[5]
local WAKE = ARGV[1]
local function lo(q) return '[' .. q .. ' ' end
local function hi(q) return '(' .. q .. '!' end
local function head(q, limit)
  return redis.call('ZRANGE', K_PENDING, lo(q), hi(q), 'BYLEX', 'LIMIT', 0, tonumber(limit))
end
local function ids_of(members)
  local ids = {}
  for i, m in ipairs(members) do ids[i] = string.sub(m, -19) end
  return ids
end
local function pairs_of(ids, bodies)
  local out = {}
  for i = 1, #ids do out[#out + 1] = ids[i]; out[#out + 1] = bodies[i] end
  return out
end
"""

#: ARGV: 2 queue, 3 body. Returns the new ID.
WRITE = """
local id = string.format('%019d', redis.call('INCR', K_SEQ))
redis.call('HSET', K_BODIES, id, ARGV[3])
redis.call('ZADD', K_PENDING, 0, ARGV[2] .. ' ' .. id)
redis.call('ZADD', K_REGISTRY, 0, ARGV[2])
redis.call('PUBLISH', WAKE .. ARGV[2], '1')
return id
"""

#: ARGV: 2 queue, 3 limit. Claims (removes) up to limit; returns {id, body, ...}.
CLAIM = """
local members = head(ARGV[2], ARGV[3])
if #members == 0 then return {} end
local ids = ids_of(members)
local bodies = redis.call('HMGET', K_BODIES, unpack(ids))
redis.call('ZREM', K_PENDING, unpack(members))
redis.call('HDEL', K_BODIES, unpack(ids))
return pairs_of(ids, bodies)
"""

#: ARGV: 2 queue, 3 limit. Returns {id, body, ...} without changing anything.
PEEK = """
local members = head(ARGV[2], ARGV[3])
if #members == 0 then return {} end
local ids = ids_of(members)
return pairs_of(ids, redis.call('HMGET', K_BODIES, unpack(ids)))
"""

#: ARGV: 2 source, 3 target, 4 limit. Moves up to limit (same IDs).
MOVE = """
local members = head(ARGV[2], ARGV[4])
if #members == 0 then return {} end
local ids = ids_of(members)
local bodies = redis.call('HMGET', K_BODIES, unpack(ids))
redis.call('ZREM', K_PENDING, unpack(members))
local moved = {}
for i, id in ipairs(ids) do moved[#moved + 1] = 0; moved[#moved + 1] = ARGV[3] .. ' ' .. id end
redis.call('ZADD', K_PENDING, unpack(moved))
redis.call('ZADD', K_REGISTRY, 0, ARGV[3])
redis.call('PUBLISH', WAKE .. ARGV[3], '1')
return pairs_of(ids, bodies)
"""

#: ARGV: 2 queue, 3 token, 4 limit. Reserves up to limit under token.
RESERVE = """
local members = head(ARGV[2], ARGV[4])
if #members == 0 then return {} end
local ids = ids_of(members)
local bodies = redis.call('HMGET', K_BODIES, unpack(ids))
redis.call('ZREM', K_PENDING, unpack(members))
local held = {}
for i, id in ipairs(ids) do held[#held + 1] = 0; held[#held + 1] = ARGV[3] .. ' ' .. id end
redis.call('ZADD', K_RESERVED, unpack(held))
return pairs_of(ids, bodies)
"""

#: ARGV: 2 token. Consumes everything the token holds; returns how many.
COMMIT = """
local held = redis.call('ZRANGE', K_RESERVED, lo(ARGV[2]), hi(ARGV[2]), 'BYLEX')
if #held == 0 then return 0 end
redis.call('ZREM', K_RESERVED, unpack(held))
redis.call('HDEL', K_BODIES, unpack(ids_of(held)))
return #held
"""

#: ARGV: 2 body. One copy into every registered queue; returns how many.
BROADCAST = """
local queues = redis.call('ZRANGE', K_REGISTRY, 0, -1)
local last = redis.call('INCRBY', K_SEQ, #queues)
for i, q in ipairs(queues) do
  local id = string.format('%019d', last - #queues + i)
  redis.call('HSET', K_BODIES, id, ARGV[2])
  redis.call('ZADD', K_PENDING, 0, q .. ' ' .. id)
end
for _, q in ipairs(queues) do redis.call('PUBLISH', WAKE .. q, '1') end
return #queues
"""

#: One round trip that does nothing: the floor of a script call.
NOOP = "return 1"

SCRIPTS = {
    "write": WRITE,
    "claim": CLAIM,
    "peek": PEEK,
    "move": MOVE,
    "reserve": RESERVE,
    "commit": COMMIT,
    "broadcast": BROADCAST,
    "noop": NOOP,
}


def new_prefix() -> str:
    """Return a fresh keyspace prefix (one hash tag, like the backend's namespaces)."""
    return f"raw:{{{uuid.uuid4().hex[:12]}}}:"


@dataclass
class RawStore:
    """One raw keyspace (fresh per sample) and its registered scripts."""

    client: redis.Redis
    prefix: str
    scripts: dict[str, Any]

    @classmethod
    def open(cls, url: str, prefix: str | None = None) -> RawStore:
        """Connect (hiredis parser, decoded replies, like the backend) and register scripts."""
        client = redis.Redis.from_url(url, decode_responses=True)
        scripts = {
            name: client.register_script(_PRELUDE + body if name != "noop" else body)
            for name, body in SCRIPTS.items()
        }
        return cls(client, prefix or new_prefix(), scripts)

    def sibling(self, prefix: str | None = None) -> RawStore:
        """Return a store on a fresh keyspace sharing this client and its scripts."""
        return RawStore(self.client, prefix or new_prefix(), self.scripts)

    @property
    def keys(self) -> list[str]:
        """KEYS of every script."""
        p = self.prefix
        return [p + "seq", p + "bodies", p + "pending", p + "registry", p + "reserved"]

    def call(self, name: str, *args: object) -> Any:
        """Run script ``name`` (one round trip)."""
        return self.scripts[name](keys=self.keys, args=[self.prefix + "wake:", *args])

    # -- operations ---------------------------------------------------------------
    def write(self, queue: str, body: str) -> int:
        """Write one message; return its ID."""
        return int(self.call("write", queue, body))

    def claim(self, queue: str, limit: int = 1) -> list[Any]:
        """Claim up to ``limit`` messages; flat [id, body, ...]."""
        return list(self.call("claim", queue, limit))

    def peek(self, queue: str, limit: int) -> list[Any]:
        """Peek up to ``limit`` messages."""
        return list(self.call("peek", queue, limit))

    def move(self, source: str, target: str, limit: int) -> list[Any]:
        """Move up to ``limit`` messages."""
        return list(self.call("move", source, target, limit))

    def reserve(self, queue: str, token: str, limit: int) -> list[Any]:
        """Reserve up to ``limit`` messages under ``token``."""
        return list(self.call("reserve", queue, token, limit))

    def commit(self, token: str) -> int:
        """Consume what ``token`` holds."""
        return int(self.call("commit", token))

    def broadcast(self, body: str) -> int:
        """Copy ``body`` into every registered queue."""
        return int(self.call("broadcast", body))

    def noop(self) -> int:
        """One empty script round trip."""
        return int(self.call("noop"))

    # -- untimed setup ----------------------------------------------------------------
    def fill(self, counts: dict[str, int], body: str) -> None:
        """Add ``counts[queue]`` pending messages to each queue (pipelined)."""
        total = sum(counts.values())
        if total == 0:
            return
        seq, bodies, pending, registry, _ = self.keys
        last = int(self.client.incrby(seq, total))
        next_id = last - total + 1
        pipe = self.client.pipeline(transaction=False)
        for queue, count in counts.items():
            pipe.zadd(registry, {queue: 0})
            for _ in range(count):
                mid = f"{next_id:019d}"
                pipe.hset(bodies, mid, body)
                pipe.zadd(pending, {f"{queue} {mid}": 0})
                next_id += 1
                if len(pipe) >= 2000:
                    pipe.execute()
        pipe.execute()

    def pending(self) -> int:
        """Return how many messages are pending (all queues)."""
        return int(self.client.zcard(self.keys[2]))

    def drop(self) -> None:
        """Delete this keyspace."""
        self.client.delete(*self.keys)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
