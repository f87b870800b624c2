"""The storage model's invariants, and snapshots made comparable across runs.

Both read a :func:`support.state.snapshot`, so a test can state exactly what
an operation left behind: the state before it, the state after it, or
nothing else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import redis

from simplebroker_redis.keys import ID_WIDTH
from simplebroker_redis.validation import validate_queue_name
from support.state import snapshot

_ID_RE = re.compile(r"^\d{19}$")
_TOKEN_RE = re.compile(r"^[0-9a-f]{32}$")
_MEMBER_SETS = ("pending", "reserved", "delayed", "claimed")


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
