"""Aliases, queue rename and broadcast."""

from __future__ import annotations

import time
import warnings

import pytest
from simplebroker.ext import MessageError, QueueNameError
from simplebroker.metadata import QueueRenameResult

from simplebroker_redis.keys import Keyspace
from support.state import members, stored, without_meta

# -- aliases ----------------------------------------------------------------------------


def test_alias_lifecycle_and_lookups(sb, open_core):
    assert sb.list_aliases() == []
    version = sb.get_alias_version()
    sb.add_alias("inbox", "jobs")
    sb.add_alias("work", "jobs")
    sb.add_alias("other", "elsewhere")
    assert sb.get_alias_version() != version
    assert sb.list_aliases() == [("inbox", "jobs"), ("other", "elsewhere"), ("work", "jobs")]
    assert sb.aliases_for_target("jobs") == ["inbox", "work"]
    assert sb.aliases_for_target("nobody") == []
    assert sb.resolve_alias("inbox") == "jobs"
    assert sb.resolve_alias("@inbox") is None  # the sigil is not part of the key
    assert sb.resolve_alias("jobs") is None
    assert sb.has_alias("work") and not sb.has_alias("jobs")
    assert sb.canonicalize_queue("@inbox") == "jobs"
    assert sb.canonicalize_queue("inbox") == "inbox"  # plain names are literal
    with pytest.raises(ValueError):
        sb.canonicalize_queue("@missing")
    with pytest.raises(ValueError):
        sb.canonicalize_queue("@")
    # Another handle sees the same map and version.
    other = open_core()
    assert other.list_aliases() == sb.list_aliases()
    assert other.get_alias_version() == sb.get_alias_version()


def test_remove_alias_bumps_the_version_even_when_absent(sb):
    sb.add_alias("inbox", "jobs")
    before = sb.get_alias_version()
    sb.remove_alias("missing")
    after_missing = sb.get_alias_version()
    assert after_missing != before
    assert sb.list_aliases() == [("inbox", "jobs")]
    sb.remove_alias("inbox")
    assert sb.get_alias_version() != after_missing
    assert sb.list_aliases() == []
    assert sb.resolve_alias("inbox") is None


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("a", "b"), ("c", "a")),  # new alias would target an alias
        (("a", "b"), ("b", "c")),  # an alias target would become an alias
        (("a", "b"), ("a", "c")),  # alias exists
    ],
    ids=["target-is-alias", "alias-is-target", "duplicate"],
)
def test_aliases_stay_flat_in_either_creation_order(sb, first, second):
    sb.add_alias(*first)
    version = sb.get_alias_version()
    with pytest.raises(ValueError):
        sb.add_alias(*second)
    assert sb.list_aliases() == [first]
    assert sb.get_alias_version() == version


@pytest.mark.parametrize(
    ("alias", "target", "error"),
    [
        ("same", "same", ValueError),
        ("a", "@b", ValueError),
        ("a", "", ValueError),
        ("-a", "b", QueueNameError),
        ("a", "b c", QueueNameError),
        ("@a", "b", QueueNameError),
    ],
)
def test_add_alias_validates_names_before_any_change(sb, alias, target, error):
    version = sb.get_alias_version()
    with pytest.raises(error):
        sb.add_alias(alias, target)
    assert sb.list_aliases() == []
    assert sb.get_alias_version() == version


def test_alias_shadowing_an_existing_queue_warns(sb):
    sb.write("inbox", "x")
    with pytest.warns(Warning, match="already exists with messages"):
        sb.add_alias("inbox", "jobs")
    assert sb.resolve_alias("inbox") == "jobs"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sb.add_alias("fresh", "jobs")  # no queue named fresh: no warning


def test_alias_mutations_in_storage(broker, raw, namespace):
    broker.add_alias("inbox", "jobs")
    state = stored(raw, namespace)
    assert state["aliases"] == {"inbox": "jobs"}
    assert int(state["meta"]["alias_version"]) == broker.get_alias_version() > 0
    broker.remove_alias("inbox")
    assert "aliases" not in stored(raw, namespace)


# -- rename ---------------------------------------------------------------------------


def test_rename_moves_every_message_and_retargets_aliases(sb):
    first = sb.write("old", "one")
    second = sb.write("old", "two")
    sb.claim_one("old")
    sb.add_alias("inbox", "old")
    sb.add_alias("keep", "elsewhere")
    version = sb.get_alias_version()
    result = sb.rename_queue("old", "new")
    assert result == QueueRenameResult("old", "new", 2, 1)
    assert sb.list_queues() == ["new"]
    assert sb.peek_many("new") == [("two", second)]
    assert sb.peek_many("new", include_claimed=True) == [("one", first), ("two", second)]
    assert sb.get_queue_stat("new").claimed == 1
    assert sb.list_aliases() == [("inbox", "new"), ("keep", "elsewhere")]
    assert sb.get_alias_version() != version


def test_rename_without_retargeting_aliases(sb):
    sb.write("old", "x")
    sb.add_alias("inbox", "old")
    version = sb.get_alias_version()
    assert sb.rename_queue("old", "new", retarget_aliases=False) == QueueRenameResult(
        "old", "new", 1, 0
    )
    assert sb.list_aliases() == [("inbox", "old")]
    assert sb.get_alias_version() == version


def test_rename_of_missing_queue_changes_nothing(sb):
    sb.add_alias("inbox", "missing")
    assert sb.rename_queue("missing", "new") == QueueRenameResult("missing", "new", 0, 0)
    assert sb.list_aliases() == [("inbox", "missing")]
    assert sb.list_queues() == []


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ("old", "taken", ValueError),
        ("old", "claimed-only", ValueError),
        ("old", "old", ValueError),
        ("old", "-bad", QueueNameError),
        ("bad name", "new", QueueNameError),
    ],
)
def test_rename_refusals_change_nothing(sb, old, new, error):
    sb.write("old", "x")
    sb.write("taken", "y")
    sb.write("claimed-only", "z")
    sb.claim_one("claimed-only")
    before = sb.get_queue_stats()
    with pytest.raises(error):
        sb.rename_queue(old, new)
    assert sb.get_queue_stats() == before


def test_rename_in_storage(broker, raw, namespace):
    first = broker.write("old", "one")
    second = broker.write("old", "two")
    broker.claim_one("old")
    broker.rename_queue("old", "new")
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["new"],
        "pending": members("new", second),
        "claimed": members("new", first),
        "bodies": {f"{first:019d}": "one", f"{second:019d}": "two"},
    }


# -- broadcast -----------------------------------------------------------------------------


@pytest.fixture
def three(sb) -> int:
    """Queues a, b, c1 with one message each; returns the high-water mark."""
    for name in ("a", "b", "c1"):
        sb.write(name, "seed")
    return sb.refresh_last_timestamp()


def _copies(sb, body: str) -> dict[str, int]:
    found = {}
    for queue in sb.list_queues():
        for message, ts in sb.peek_many(queue):
            if message == body:
                found[queue] = ts
    return found


def test_patternless_broadcast_reaches_every_queue_with_fresh_ids(sb, three):
    sb.claim_one("c1")  # a claimed-only queue still exists and is reached
    assert sb.broadcast("hello") == 3
    copies = _copies(sb, "hello")
    assert sorted(copies) == ["a", "b", "c1"]
    assert len(set(copies.values())) == 3
    assert min(copies.values()) > three
    assert sb.refresh_last_timestamp() == max(copies.values())
    assert sb.broadcast("", pattern="") == 3  # empty pattern means every queue
    assert sorted(_copies(sb, "")) == ["a", "b", "c1"]


def test_pattern_broadcast_matches_existing_names_only(sb, three):
    assert sb.broadcast("p", pattern="c*") == 1
    assert sb.broadcast("p2", pattern="[ab]") == 2
    assert sorted(_copies(sb, "p")) == ["c1"]
    assert sorted(_copies(sb, "p2")) == ["a", "b"]
    assert sb.list_queues() == ["a", "b", "c1"]


def test_exact_broadcast_dedupes_and_ignores_missing_names(sb, three):
    assert sb.broadcast("e", queue_names=["a", "zz", "a", "c1"]) == 2
    assert sorted(_copies(sb, "e")) == ["a", "c1"]
    assert sb.list_queues() == ["a", "b", "c1"]


def test_exact_broadcast_can_create_missing_queues(sb, three):
    assert sb.broadcast("f", queue_names=("new1", "a", "new1"), create_missing=True) == 2
    assert sorted(_copies(sb, "f")) == ["a", "new1"]
    assert sb.list_queues() == ["a", "b", "c1", "new1"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"queue_names": []},
        {"queue_names": (), "create_missing": True},
        {"queue_names": ["zz", "yy"]},
        {"pattern": "nomatch*"},
    ],
    ids=["empty-list", "empty-create", "all-missing", "no-match"],
)
def test_broadcast_reaching_nothing_changes_nothing(sb, open_core, three, kwargs):
    before = sb.get_queue_stats()
    assert sb.broadcast("nothing", **kwargs) == 0
    assert sb.get_queue_stats() == before
    assert open_core().refresh_last_timestamp() == three


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"pattern": "a", "queue_names": ["a"]}, ValueError),
        ({"pattern": "", "queue_names": ["a"]}, ValueError),
        ({"queue_names": "ab"}, TypeError),
        ({"create_missing": True}, ValueError),
        ({"queue_names": ["a"], "create_missing": 1}, TypeError),
        ({"queue_names": ["a", "-bad"]}, QueueNameError),
        ({"queue_names": ["@a"]}, QueueNameError),  # exact names never resolve aliases
    ],
)
def test_broadcast_selector_errors_change_nothing(sb, three, kwargs, error):
    sb.add_alias("al", "a")
    before = sb.get_queue_stats()
    with pytest.raises(error):
        sb.broadcast("x", **kwargs)
    assert sb.get_queue_stats() == before
    assert sb.refresh_last_timestamp() == three


@pytest.mark.parametrize("body", [5, None, "\udfff"])
def test_broadcast_rejects_bad_bodies(sb, three, body):
    with pytest.raises(MessageError):
        sb.broadcast(body, queue_names=["new"], create_missing=True)
    assert sb.list_queues() == ["a", "b", "c1"]


def test_broadcast_in_storage(broker, raw, namespace):
    seed = broker.write("a", "seed")
    broker.broadcast("all", queue_names=["a", "b"], create_missing=True)
    copies = {queue: broker.peek_one(queue, order="newest")[1] for queue in ("a", "b")}
    state = stored(raw, namespace)
    assert state["meta"]["last_ts"] == f"{max(copies.values()):019d}"
    assert without_meta(state) == {
        "queues": ["a", "b"],
        "pending": sorted(members("a", seed, copies["a"]) + members("b", copies["b"])),
        "bodies": {
            f"{seed:019d}": "seed",
            f"{copies['a']:019d}": "all",
            f"{copies['b']:019d}": "all",
        },
    }


def test_broadcast_meeting_a_stored_id_retries_as_a_whole(broker, raw, namespace):
    for name in ("a", "b", "c"):
        broker.write(name, "seed")
    keys = Keyspace.for_namespace(namespace)
    ahead = (time.time_ns() + 5 * 10**9) & ~4095
    raw.hset(keys.meta, "last_ts", f"{ahead:019d}")
    raw.hset(keys.bodies, f"{ahead + 2:019d}", "ghost")  # damaged: blocks the first attempt
    assert broker.broadcast("all") == 3
    copies = {q: broker.peek_one(q, order="newest") for q in ("a", "b", "c")}
    assert sorted(ts for _, ts in copies.values()) == [ahead + 3, ahead + 4, ahead + 5]
    assert {body for body, _ in copies.values()} == {"all"}
    assert raw.hget(keys.bodies, f"{ahead + 1:019d}") is None  # nothing left of attempt one
    assert raw.hget(keys.bodies, f"{ahead + 2:019d}") == "ghost"
    assert raw.hget(keys.meta, "last_ts") == f"{ahead + 5:019d}"


def test_legacy_aliases_stay_visible_resolvable_and_removable(broker, raw, namespace):
    # Aliases stored by an older release may break today's rules (a target
    # that is not a valid name, a chain); they must still be readable and removable.
    aliases = Keyspace.for_namespace(namespace).aliases
    raw.hset(aliases, mapping={"legacy": "bad target", "chain-a": "chain-b", "chain-b": "end"})
    assert broker.list_aliases() == [
        ("chain-a", "chain-b"),
        ("chain-b", "end"),
        ("legacy", "bad target"),
    ]
    assert broker.resolve_alias("legacy") == "bad target"
    assert broker.resolve_alias("chain-a") == "chain-b"  # one hop only
    assert broker.canonicalize_queue("@chain-a") == "chain-b"
    for name in ("legacy", "chain-a", "chain-b"):
        broker.remove_alias(name)
    assert broker.list_aliases() == []
    assert raw.exists(aliases) == 0
