"""Helpers of the fault suite: stored-state snapshots, canonical forms, invariants.

Every check here reads the server directly (never through the backend), so
a test can state exactly what a fault left behind: the state before the
operation, the state after it, or nothing else.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from simplebroker_redis.keys import ID_WIDTH, Keyspace
from simplebroker_redis.validation import validate_queue_name

_ID_RE = re.compile(r"^\d{19}$")
_TOKEN_RE = re.compile(r"^[0-9a-f]{32}$")
_MEMBER_SETS = ("pending", "reserved", "delayed", "claimed")


def prefix(namespace: str) -> str:
    """Return the key prefix of ``namespace``."""
    return Keyspace.for_namespace(namespace).prefix


def snapshot(raw: redis.Redis, namespace: str) -> dict[str, Any]:
    """Return every key under the namespace prefix, decoded exactly, by short name."""
    head = prefix(namespace)
    out: dict[str, Any] = {}
    for key in sorted(raw.scan_iter(match=head + "*", count=1000)):
        short = key[len(head) :]
        kind = raw.type(key)
        if kind == "zset":
            out[short] = raw.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            out[short] = raw.hgetall(key)
        elif kind == "string":
            out[short] = raw.get(key)
        elif kind == "list":
            out[short] = raw.lrange(key, 0, -1)
        elif kind == "set":
            out[short] = sorted(raw.smembers(key))
        else:
            out[short] = kind
    return out


def whole_server(raw: redis.Redis) -> dict[str, Any]:
    """Return a digest of every key of the database (for "nothing else changed")."""
    out: dict[str, Any] = {}
    for key in sorted(raw.scan_iter(count=1000)):
        out[key] = (raw.type(key), raw.dump(key))
    return out


def _ids_in(state: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for name in (*_MEMBER_SETS, "due"):
        for member, _ in state.get(name, []):
            found.add(member[-ID_WIDTH:])
    for name in ("bodies", "deliveries", "owners"):
        found.update(state.get(name, {}))
    for member, _ in state.get("token_ids", []):
        found.add(member[-ID_WIDTH:])
    last = state.get("meta", {}).get("last_ts")
    if last:
        found.add(last)
    return {value for value in found if _ID_RE.match(value)}


class _Canon:
    """Renames run-specific values of one snapshot (see :func:`canonical`)."""

    def __init__(self, state: dict[str, Any], known_ids: Iterable[int]) -> None:
        known = {f"{value:019d}" for value in known_ids}
        fresh = sorted(i for i in _ids_in(state) if i not in known)
        self.ids = {value: f"new{n}" for n, value in enumerate(fresh)}
        held: dict[str, list[str]] = {}
        for member, _ in state.get("token_ids", []):
            token, _, message_id = member.partition(" ")
            held.setdefault(token, []).append(self.id(message_id))
        self.tokens = {token: f"tok({','.join(sorted(v))})" for token, v in held.items()}

    def id(self, value: str) -> str:
        return self.ids.get(value, value)

    def member(self, value: str) -> str:
        return f"{value[: -ID_WIDTH - 1]} {self.id(value[-ID_WIDTH:])}"

    def token(self, value: str) -> str:
        return self.tokens.get(value, "tok()" if _TOKEN_RE.match(value) else value)

    def members(self, value: list[tuple[str, float]]) -> list[str]:
        return sorted(self.member(m) for m, _ in value)

    def lease_tokens(self, value: list[tuple[str, float]]) -> list[str]:
        return sorted(self.token(m) for m, _ in value)

    def links(self, value: list[tuple[str, float]]) -> list[str]:
        return sorted(
            f"{self.token(m.partition(' ')[0])} {self.id(m.partition(' ')[2])}" for m, _ in value
        )

    def names(self, value: list[tuple[str, float]]) -> list[str]:
        return sorted(m for m, _ in value)

    def by_id(self, value: dict[str, str]) -> dict[str, str]:
        return {self.id(k): v for k, v in value.items()}

    def owners(self, value: dict[str, str]) -> dict[str, str]:
        return {self.id(k): self.token(v) for k, v in value.items()}

    def records(self, value: dict[str, str]) -> dict[str, Any]:
        out = {}
        for token, raw_record in value.items():
            record = json.loads(raw_record)
            record.pop("c", None)  # created and deadline: server times
            record.pop("d", None)
            out[self.token(token)] = record
        return out

    def meta(self, value: dict[str, str]) -> dict[str, str]:
        meta = dict(value)
        meta["last_ts"] = self.id(meta.get("last_ts", ""))
        if meta.get("alias_version", "0") != "0":
            meta["alias_version"] = "bumped"  # a time_ns() value
        return meta

    def convert(self, name: str, value: Any) -> Any:
        by_name = {
            **dict.fromkeys((*_MEMBER_SETS, "due"), self.members),
            "leases": self.lease_tokens,
            "token_ids": self.links,
            "queues": self.names,
            "bodies": self.by_id,
            "deliveries": self.by_id,
            "owners": self.owners,
            "tokens": self.records,
            "meta": self.meta,
        }
        convert = by_name.get(name)
        return value if convert is None else convert(value)


def canonical(state: dict[str, Any], known_ids: Iterable[int]) -> dict[str, Any]:
    """Return ``state`` with run-specific values replaced by stable names.

    IDs not in ``known_ids`` become ``new0, new1, ...`` (by value), tokens
    become ``tok(<their ids>)``, server times (lease deadlines, due times,
    creation times) and alias versions are dropped. Two runs of the same
    operation on identical data then have equal canonical states.
    """
    canon = _Canon(state, known_ids)
    return {name: canon.convert(name, value) for name, value in state.items()}


def check_invariants(raw: redis.Redis, namespace: str) -> None:
    """Assert every storage-model invariant of docs/architecture.md on ``namespace``.

    A message lives in exactly one state set with a body; registries, due
    times, owners, token links and leases all agree; the high-water mark is
    at or above every stored ID. Raises AssertionError naming the first
    violation.
    """
    state = snapshot(raw, namespace)
    problems = _violations(state)
    assert not problems, f"storage invariants broken in {namespace}: {problems[:10]}"


def _violations(state: dict[str, Any]) -> list[str]:  # noqa: C901 - one flat checklist
    problems: list[str] = []
    meta = state.get("meta", {})
    if meta.get("magic") != "simplebroker-redis" or meta.get("schema_version") != "1":
        problems.append(f"meta {meta!r}")
    last_ts = meta.get("last_ts", "")
    if not _ID_RE.match(last_ts):
        problems.append(f"last_ts {last_ts!r}")
    where: dict[str, str] = {}
    queues_with_rows: set[str] = set()
    for name in _MEMBER_SETS:
        for member, score in state.get(name, []):
            queue, _, message_id = member.rpartition(" ")
            try:
                validate_queue_name(queue)
            except Exception:  # noqa: BLE001 - reported as a violation
                problems.append(f"{name} member {member!r} has a bad queue name")
            if not _ID_RE.match(message_id) or score != 0:
                problems.append(f"{name} member {member!r} score {score}")
            if message_id in where:
                problems.append(f"id {message_id} in {where[message_id]} and {name}:{queue}")
            where[message_id] = f"{name}:{queue}"
            queues_with_rows.add(queue)
            if message_id > last_ts:
                problems.append(f"id {message_id} above last_ts {last_ts}")
    bodies = state.get("bodies", {})
    if set(bodies) != set(where):
        problems.append(
            f"bodies without a member {sorted(set(bodies) - set(where))[:5]}, "
            f"members without a body {sorted(set(where) - set(bodies))[:5]}"
        )
    registered = {m for m, _ in state.get("queues", [])}
    if registered != queues_with_rows:
        problems.append(f"queues registry {sorted(registered ^ queues_with_rows)[:5]} disagrees")
    delayed = {m for m, _ in state.get("delayed", [])}
    due = {m for m, _ in state.get("due", [])}
    if delayed != due:
        problems.append(f"delayed/due disagree: {sorted(delayed ^ due)[:5]}")
    if not set(state.get("deliveries", {})) <= set(bodies):
        problems.append("delivery counts of deleted messages")
    problems.extend(_reservation_violations(state, where))
    return problems


def _reservation_violations(state: dict[str, Any], where: dict[str, str]) -> list[str]:
    reserved = {mid for mid, place in where.items() if place.startswith("reserved:")}
    owners = state.get("owners", {})
    tokens = state.get("tokens", {})
    links = {m.partition(" ")[2]: m.partition(" ")[0] for m, _ in state.get("token_ids", [])}
    problems = (
        [f"owners {sorted(set(owners) ^ reserved)[:5]} vs reserved"]
        if set(owners) != reserved
        else []
    )
    if set(links) != reserved:
        problems.append(f"token links {sorted(set(links) ^ reserved)[:5]} vs reserved")
    for message_id in reserved:
        token = owners.get(message_id)
        queue = where[message_id].split(":", 1)[1]
        if token not in tokens or links.get(message_id) != token:
            problems.append(f"reserved {message_id} held by {token}, unknown or unlinked")
        elif json.loads(tokens[token])["q"] != queue:
            problems.append(f"reserved {message_id} in {queue}, token of another queue")
    problems.extend(_token_violations(tokens, set(links.values()), state.get("leases", [])))
    return problems


def _token_violations(
    tokens: dict[str, str], linked: set[str], leases: list[tuple[str, float]]
) -> list[str]:
    problems = []
    lease_tokens = {m for m, _ in leases}
    for token, raw_record in tokens.items():
        if token not in linked:
            problems.append(f"token {token} holds nothing")
        deadline = int(json.loads(raw_record)["d"])
        if (deadline >= 0) != (token in lease_tokens):
            problems.append(f"token {token} deadline {deadline} vs leases")
    if not lease_tokens <= set(tokens):
        problems.append(f"leases of unknown tokens {sorted(lease_tokens - set(tokens))[:5]}")
    return problems


def backend_connections(raw: redis.Redis, pid: int | None = None) -> list[dict[str, Any]]:
    """Return CLIENT LIST entries of this process's backend connections (Pub/Sub included)."""
    owner = os.getpid() if pid is None else pid
    names = {f"simplebroker-redis:{owner}", f"simplebroker-redis-wake:{owner}"}
    return [client for client in raw.client_list() if client.get("name") in names]


@contextmanager
def watch_backend_ports(admins: Sequence[redis.Redis]) -> Iterator[set[tuple[str, int]]]:
    """Yield a set that fills, while the block runs, with this process's backend connections.

    Each is ``(kind, server port)``, kind ``command`` or ``wake`` (Pub/Sub),
    read from CLIENT LIST of every ``admins`` server every 50 ms and once
    more at the end (pooled connections still open then are seen however
    short the block): a test can then tell which port (TLS or plain) each
    kind of connection used.
    """
    seen: set[tuple[str, int]] = set()
    done = threading.Event()

    def poll_once() -> None:
        for admin in admins:
            for client in backend_connections(admin):
                wake = client["name"].startswith("simplebroker-redis-wake:")
                kind = "wake" if wake else "command"
                seen.add((kind, int(client["laddr"].rsplit(":", 1)[1])))

    def poll() -> None:
        while not done.is_set():
            poll_once()
            done.wait(0.05)

    watcher = threading.Thread(target=poll, daemon=True, name="watch-backend-ports")
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join(10)
    poll_once()


def wait_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


# -- passwords and the CLI ---------------------------------------------------------------

#: A password with every character that needs quoting in a URL.
SECRET = "pa:ss/w@rd%?#-" + uuid.uuid4().hex[:8]
QUOTED = quote(SECRET, safe="")


def texts_of(exc: BaseException) -> str:
    """Return everything an exception can show: str, repr, the formatted chain."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


def assert_secret_free(*texts: str) -> None:
    """Fail if any text shows SECRET (raw or URL-quoted) or the wrong password hunter2."""
    for text in texts:
        for form in (SECRET, QUOTED, "hunter2"):
            assert form not in text, (
                f"password leaked: ...{text[max(0, text.find(form) - 60) :][:160]}"
            )


def broker_cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run SimpleBroker's ``broker`` CLI in ``cwd`` (extra environment in ``env``)."""
    cli = Path(sys.executable).with_name("broker")
    return subprocess.run(
        [str(cli), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def write_project(
    directory: Path, target: str, namespace: str, *, scripting: str = "functions"
) -> Path:
    """Write a ``.broker.toml`` for the redis backend into ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{target}"\n\n'
        f'[backend_options]\nnamespace = "{namespace}"\nscripting = "{scripting}"\n',
        encoding="utf-8",
    )
    return directory
