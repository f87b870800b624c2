"""The key schema: every Redis key and channel name of one namespace.

All keys of a namespace share the hash tag ``{namespace}``, so a namespace
lives in one Redis Cluster slot and every Lua script can declare all of its
keys in ``KEYS``. The schema is deliberately *fixed*: there is no per-queue
key. Queue membership is encoded in sorted-set members instead
(``"<queue> <19-digit id>"``, all scores 0, ordered lexicographically), so no
key name is ever built from user input and a broadcast to every queue touches
a constant set of keys.

Why the member format works: queue names only use ``[A-Za-z0-9_.-]`` (all at
or above ``0x2D``), the separator is a space (``0x20``) and IDs are
zero-padded to 19 digits. Lexicographic order is therefore (queue, id) order,
and the members of one queue form the contiguous range ``["q ", "q!")``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

#: Current Redis storage schema version, stored in the namespace meta hash.
SCHEMA_VERSION: Final[int] = 1

#: Magic string stored in the meta hash; identifies a simplebroker-redis namespace.
MAGIC: Final[str] = "simplebroker-redis"

#: Namespace used when ``backend_options`` does not name one.
DEFAULT_NAMESPACE: Final[str] = "simplebroker_redis_v1"

#: Prefix outside the hash tag, so our keys never collide with an application's.
KEY_PREFIX: Final[str] = "sb"

#: Width of a zero-padded message ID inside sorted-set members.
ID_WIDTH: Final[int] = 19

#: Largest storable message ID (SimpleBroker's exclusive bound is 2**63).
MAX_ID: Final[int] = 2**63 - 1

#: What follows the namespace prefix in every key of the Celery integration.
CELERY_PREFIX: Final[str] = "celery:"

#: What follows the namespace prefix in every key of the Dramatiq integration.
DRAMATIQ_PREFIX: Final[str] = "dramatiq:"

#: The fixed keys of a namespace, in the order scripts receive them as
#: ``KEYS`` (Lua names them ``K_<NAME>``), with their Redis types. ``meta``
#: comes first; ``schedules`` (Taskiq) last, because it may exist before the
#: namespace does. Every other key exists only in an initialized namespace.
#: A new key goes before ``schedules``.
FIXED_KEYS: Final[tuple[tuple[str, str], ...]] = (
    ("meta", "hash"),
    ("queues", "zset"),
    ("pending", "zset"),
    ("reserved", "zset"),
    ("delayed", "zset"),
    ("due", "zset"),
    ("claimed", "zset"),
    ("bodies", "hash"),
    ("deliveries", "hash"),
    ("owners", "hash"),
    ("tokens", "hash"),
    ("token_ids", "zset"),
    ("leases", "zset"),
    ("aliases", "hash"),
    ("dead_letters", "stream"),
    ("schedule_runs", "hash"),
    ("schedule_claims", "hash"),
    ("workers", "hash"),
    ("counters", "hash"),
    ("tasks", "hash"),
    ("task_minutes", "zset"),
    ("task_stats", "hash"),
    ("task_totals", "hash"),
    ("schedules", "hash"),
)

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def validate_namespace(namespace: object) -> str:
    """Return ``namespace`` if it is a usable namespace name, else raise."""
    if not isinstance(namespace, str):
        raise TypeError("backend option 'namespace' must be a string")
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise ValueError(
            "backend option 'namespace' must be 1-128 characters of letters, "
            "digits, '_', '.', ':' or '-'"
        )
    return namespace


def format_id(message_id: int) -> str:
    """Return the 19-digit, zero-padded form used in members and hash fields."""
    return f"{message_id:0{ID_WIDTH}d}"


def member(queue: str, message_id: int) -> str:
    """Return the sorted-set member that places ``message_id`` in ``queue``."""
    return f"{queue} {message_id:0{ID_WIDTH}d}"


def queue_bounds(queue: str) -> tuple[str, str]:
    """Return the lex range (``ZRANGE ... BYLEX`` bounds) of ``queue``'s members."""
    return f"[{queue} ", f"({queue}!"


@dataclass(frozen=True, slots=True)
class Keyspace:
    """All key and channel names of one namespace.

    Attributes are complete Redis key names. Scripts receive them through
    ``KEYS``; nothing else in the package formats a key.
    """

    namespace: str
    prefix: str
    meta: str  #: hash: magic, schema_version, last_ts, alias_version
    queues: str  #: zset (lex): names of queues that hold any message
    pending: str  #: zset (lex): claimable messages, "<queue> <id>"
    reserved: str  #: zset (lex): messages held by a live reservation
    delayed: str  #: zset (lex): pending messages not claimable before a time
    due: str  #: zset: delayed member -> due time in server microseconds
    claimed: str  #: zset (lex): consumed messages awaiting vacuum
    bodies: str  #: hash: id -> body (pending, reserved, delayed or claimed)
    deliveries: str  #: hash: id -> how many times the message was reserved
    owners: str  #: hash: id -> token of the reservation holding it
    tokens: str  #: hash: token -> JSON reservation record
    token_ids: str  #: zset (lex): "<token> <id>" for every reserved id
    leases: str  #: zset: token -> lease deadline in server microseconds
    aliases: str  #: hash: alias -> canonical queue name
    dead_letters: str  #: stream: messages dead-lettered after max deliveries, until reported
    schedule_runs: str  #: hash: schedule id -> its last claimed run (Taskiq)
    schedule_claims: str  #: hash: "<schedule id> <run>" -> claimed, not yet sent (Taskiq)
    workers: str  #: hash: worker id -> "<beat µs> <JSON record>" (heartbeats)
    counters: str  #: hash: "<queue> <event>" -> messages counted by the scripts
    tasks: str  #: hash: the task index, "k:<framework>:<task id>" <-> "i:<message id>"
    task_minutes: str  #: zset: "<minute> <task name>" -> minute, for retention
    task_stats: str  #: hash: "<minute> <task name>" -> that minute's task record
    task_totals: str  #: hash: task name -> its task record since the namespace began
    schedules: str  #: hash: schedule id -> JSON schedule (Taskiq)
    wake_prefix: str  #: Pub/Sub channel prefix; append a queue name

    @classmethod
    def for_namespace(cls, namespace: str) -> Keyspace:
        """Build the keyspace of ``namespace`` (validated)."""
        validate_namespace(namespace)
        prefix = f"{KEY_PREFIX}:{{{namespace}}}:"
        return cls(
            namespace=namespace,
            prefix=prefix,
            wake_prefix=prefix + "wake:",
            **{name: prefix + name for name, _ in FIXED_KEYS},
        )

    @property
    def fixed_keys(self) -> tuple[str, ...]:
        """Every fixed key of the namespace, in ``KEYS`` order (meta first)."""
        return tuple(getattr(self, name) for name, _ in FIXED_KEYS)

    def wake_channel(self, queue: str) -> str:
        """Return the Pub/Sub channel announcing new pending work in ``queue``."""
        return self.wake_prefix + queue

    def result_key(self, task_id: str) -> str:
        """Return the key of a Taskiq result (inside the namespace hash tag)."""
        return f"{self.prefix}result:{task_id}"

    def sent_key(self, key: str) -> str:
        """Return the key recording a write's idempotency key (a string: its message ID)."""
        return f"{self.prefix}sent:{key}"

    def progress_key(self, task_id: str) -> str:
        """Return the key of a Taskiq progress record."""
        return f"{self.prefix}progress:{task_id}"

    # -- The rooms of Celery and Dramatiq: not fixed keys; scripts get them as extra KEYS.
    def celery(self, name: str) -> str:
        """Return the Celery integration's key ``name`` (``calls/celery.py`` names them)."""
        return f"{self.prefix}{CELERY_PREFIX}{name}"

    def dramatiq(self, name: str) -> str:
        """Return the Dramatiq integration's key ``name`` (``calls/dramatiq.py`` names them)."""
        return f"{self.prefix}{DRAMATIQ_PREFIX}{name}"

    @property
    def scan_pattern(self) -> str:
        """Return a SCAN MATCH pattern covering every key of the namespace."""
        # The namespace grammar admits no glob metacharacter (* ? [ ] \\).
        return f"{self.prefix}*"
