"""Claim, peek and move: selection, bounds, order, exact IDs and validation."""

from __future__ import annotations

import pytest
from simplebroker.ext import QueueNameError

from simplebroker_redis.keys import Keyspace
from support.state import members, stored, without_meta

#: Run on a single server, a Redis Cluster and a Sentinel group (conftest.py).
TOPOLOGIES = ("single", "cluster", "sentinel")

N = 6


@pytest.fixture
def ids(sb) -> list[int]:
    """Six pending messages m0..m5 in queue ``q``."""
    return [sb.write("q", f"m{i}") for i in range(N)]


def _bodies(rows) -> list[str]:
    return [body for body, _ in rows]


def _pending_ids(sb, queue: str = "q") -> list[int]:
    return [ts for _, ts in sb.peek_many(queue)]


# -- claim ------------------------------------------------------------------------


def test_claim_one_takes_oldest_or_newest(sb, ids):
    assert sb.claim_one("q") == ("m0", ids[0])
    assert sb.claim_one("q", order="newest") == ("m5", ids[5])
    assert sb.claim_one("q", with_timestamps=False) == "m1"
    assert _pending_ids(sb) == ids[2:5]
    assert sb.claim_one("empty") is None


@pytest.mark.parametrize("form", [int, lambda ts: f"{ts:019d}", lambda ts: f" {ts:019d} "])
def test_claim_one_by_exact_id_in_either_form(sb, ids, form):
    assert sb.claim_one("q", exact_timestamp=form(ids[3])) == ("m3", ids[3])
    assert sb.claim_one("q", exact_timestamp=form(ids[3])) is None  # already claimed
    assert sb.claim_one("other", exact_timestamp=ids[4]) is None  # wrong queue
    assert _pending_ids(sb) == ids[:3] + ids[4:]


@pytest.mark.parametrize(
    ("after", "before", "order", "limit", "expected"),
    [
        (None, None, "oldest", 10, [0, 1, 2, 3, 4, 5]),
        (None, None, "oldest", 2, [0, 1]),
        (None, None, "newest", 2, [5, 4]),
        (1, None, "oldest", 10, [2, 3, 4, 5]),  # after is strict
        (None, 4, "oldest", 10, [0, 1, 2, 3]),  # before is strict
        (1, 4, "oldest", 10, [2, 3]),
        (1, 4, "newest", 1, [3]),
        (2, 3, "oldest", 10, []),
        (4, 1, "oldest", 10, []),
    ],
)
def test_claim_many_respects_strict_bounds_limit_and_order(
    sb, ids, after, before, order, limit, expected
):
    got = sb.claim_many(
        "q",
        limit,
        after_timestamp=None if after is None else ids[after],
        before_timestamp=None if before is None else ids[before],
        order=order,
    )
    assert got == [(f"m{i}", ids[i]) for i in expected]
    assert _pending_ids(sb) == [ids[i] for i in range(N) if i not in expected]
    assert sb.count_claimed_messages() == len(expected)


def test_claim_many_without_timestamps_and_at_least_once_selector(sb, ids):
    assert sb.claim_many("q", 2, with_timestamps=False) == ["m0", "m1"]
    # Materialized batches commit before returning under either guarantee.
    assert sb.claim_many("q", 2, delivery_guarantee="at_least_once") == [
        ("m2", ids[2]),
        ("m3", ids[3]),
    ]
    assert sb.get_queue_stat("q").claimed == 4


def test_claim_generator_commits_each_message_before_yielding(sb, ids):
    gen = sb.claim_generator("q", with_timestamps=False)
    assert [next(gen), next(gen)] == ["m0", "m1"]
    gen.close()
    assert _pending_ids(sb) == ids[2:]
    rest = list(sb.claim_generator("q", after_timestamp=ids[2], before_timestamp=ids[5]))
    assert rest == [("m3", ids[3]), ("m4", ids[4])]
    assert list(sb.claim_generator("q", exact_timestamp=ids[5])) == [("m5", ids[5])]
    assert _pending_ids(sb) == [ids[2]]


# -- peek --------------------------------------------------------------------------


def test_peek_observes_without_changing_anything(sb, ids):
    stats_before = sb.get_queue_stats()
    assert sb.peek_one("q") == ("m0", ids[0])
    assert sb.peek_one("q", order="newest", with_timestamps=False) == "m5"
    assert sb.peek_one("q", exact_timestamp=f"{ids[2]:019d}") == ("m2", ids[2])
    assert sb.peek_many("q", 3, order="newest") == [(f"m{i}", ids[i]) for i in (5, 4, 3)]
    assert sb.peek_many("q", after_timestamp=ids[1], before_timestamp=ids[4]) == [
        ("m2", ids[2]),
        ("m3", ids[3]),
    ]
    assert sb.peek_many("q", with_timestamps=False) == [f"m{i}" for i in range(N)]
    assert sb.get_queue_stats() == stats_before
    assert sb.peek_one("empty") is None
    assert sb.peek_many("empty") == []


def test_include_claimed_merges_claimed_rows_in_id_order(sb, ids):
    sb.claim_one("q", exact_timestamp=ids[1])
    sb.claim_one("q", exact_timestamp=ids[4])
    assert _bodies(sb.peek_many("q")) == ["m0", "m2", "m3", "m5"]
    assert _bodies(sb.peek_many("q", include_claimed=True)) == [f"m{i}" for i in range(N)]
    assert _bodies(sb.peek_many("q", 3, include_claimed=True, order="newest")) == [
        "m5",
        "m4",
        "m3",
    ]
    assert sb.peek_one("q", exact_timestamp=ids[1]) is None
    assert sb.peek_one("q", exact_timestamp=ids[1], include_claimed=True) == ("m1", ids[1])
    assert sb.get_queue_stat("q").claimed == 2  # peeking never unclaims


def test_peek_generator_pages_by_id_cursor(sb, ids):
    sb.claim_one("q", exact_timestamp=ids[2])
    assert list(sb.peek_generator("q", batch_size=2, with_timestamps=False)) == [
        "m0",
        "m1",
        "m3",
        "m4",
        "m5",
    ]
    assert [ts for _, ts in sb.peek_generator("q", batch_size=2, include_claimed=True)] == ids
    assert list(
        sb.peek_generator("q", after_timestamp=ids[1], before_timestamp=ids[5], batch_size=1)
    ) == [("m3", ids[3]), ("m4", ids[4])]
    assert list(sb.peek_generator("q", exact_timestamp=ids[4])) == [("m4", ids[4])]
    assert list(sb.peek_generator("q", exact_timestamp=ids[2])) == []
    assert list(sb.peek_generator("q", exact_timestamp=ids[2], include_claimed=True)) == [
        ("m2", ids[2])
    ]
    assert sb.get_queue_stat("q").pending == 5


# -- move --------------------------------------------------------------------------


def test_move_one_keeps_id_and_body(sb, ids):
    assert sb.move_one("q", "dest") == ("m0", ids[0])
    assert sb.move_one("q", "dest", order="newest", with_timestamps=False) == "m5"
    assert sb.move_one("q", "dest", exact_timestamp=f"{ids[3]:019d}") == ("m3", ids[3])
    assert sb.move_one("q", "dest", exact_timestamp=ids[3]) is None
    assert sb.peek_many("dest") == [("m0", ids[0]), ("m3", ids[3]), ("m5", ids[5])]
    assert _pending_ids(sb) == [ids[1], ids[2], ids[4]]
    assert sb.move_one("empty", "dest") is None
    assert sb.list_queues() == ["dest", "q"]


def test_move_many_with_bounds_and_order(sb, ids):
    moved = sb.move_many("q", "dest", 2, after_timestamp=ids[0], order="newest")
    assert moved == [("m5", ids[5]), ("m4", ids[4])]
    moved = sb.move_many("q", "dest", 10, before_timestamp=ids[3], with_timestamps=False)
    assert moved == ["m0", "m1", "m2"]
    assert _pending_ids(sb, "dest") == [ids[0], ids[1], ids[2], ids[4], ids[5]]
    assert _pending_ids(sb) == [ids[3]]


def test_moving_the_last_message_drops_the_source_queue(sb, ids):
    assert len(sb.move_many("q", "dest", 100)) == N
    assert sb.list_queues() == ["dest"]
    assert not sb.queue_exists("q")


def test_move_by_exact_id_of_claimed_message_keeps_it_claimed(sb, ids):
    sb.claim_one("q", exact_timestamp=ids[2])
    assert sb.move_one("q", "dest", exact_timestamp=ids[2]) is None
    assert sb.move_one("q", "dest", exact_timestamp=ids[2], require_unclaimed=False) == (
        "m2",
        ids[2],
    )
    stat = sb.get_queue_stat("dest")
    assert (stat.pending, stat.claimed) == (0, 1)
    assert sb.peek_one("dest") is None
    assert sb.peek_one("dest", include_claimed=True) == ("m2", ids[2])
    assert sb.claim_one("dest") is None
    assert sb.get_queue_stat("q").claimed == 0


def test_move_many_including_claimed_preserves_each_state(sb, ids):
    sb.claim_many("q", 2)
    moved = sb.move_many("q", "dest", 3, require_unclaimed=False)
    assert moved == [("m0", ids[0]), ("m1", ids[1]), ("m2", ids[2])]
    stat = sb.get_queue_stat("dest")
    assert (stat.pending, stat.claimed) == (1, 2)
    assert sb.peek_many("dest") == [("m2", ids[2])]


def test_move_generator_moves_one_at_a_time(sb, ids):
    gen = sb.move_generator("q", "dest", after_timestamp=ids[3], with_timestamps=False)
    assert next(gen) == "m4"
    gen.close()
    assert _pending_ids(sb, "dest") == [ids[4]]
    assert list(sb.move_generator("q", "dest", exact_timestamp=ids[0])) == [("m0", ids[0])]
    assert list(sb.move_generator("q", "dest")) == [(f"m{i}", ids[i]) for i in (1, 2, 3, 5)]
    assert sb.list_queues() == ["dest"]


def test_moved_messages_state_in_storage(broker, raw, namespace):
    first = broker.write("q", "a")
    second = broker.write("q", "b")
    broker.claim_one("q")
    broker.move_one("q", "dest", exact_timestamp=first, require_unclaimed=False)
    broker.move_one("q", "dest")
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["dest"],
        "pending": members("dest", second),
        "claimed": members("dest", first),
        "bodies": {f"{first:019d}": "a", f"{second:019d}": "b"},
    }


# -- validation happens before any change --------------------------------------------


def _call(sb, name: str, kwargs: dict[str, object]) -> None:
    args: dict[str, tuple[object, ...]] = {
        "claim_one": ("q",),
        "claim_many": ("q", 1),
        "peek_one": ("q",),
        "peek_many": ("q", 1),
        "move_one": ("q", "dest"),
        "move_many": ("q", "dest", 1),
    }
    result = getattr(sb, name)(*args[name], **kwargs)
    if name.endswith("generator"):
        list(result)


BAD_BOUNDS = [
    ({"after_timestamp": -1}, ValueError),
    ({"after_timestamp": True}, TypeError),
    ({"after_timestamp": "1"}, TypeError),
    ({"before_timestamp": 2**63}, ValueError),
    ({"before_timestamp": 1.5}, TypeError),
]
BAD_EXACT = [
    ({"exact_timestamp": "123"}, ValueError),
    ({"exact_timestamp": "abcdefghijklmnopqrs"}, ValueError),
    ({"exact_timestamp": True}, TypeError),
    ({"exact_timestamp": 1.5}, TypeError),
    ({"exact_timestamp": -1}, ValueError),
    ({"exact_timestamp": 2**63}, ValueError),
]
BAD_ORDER = [({"order": "OLDEST"}, ValueError), ({"order": "latest"}, ValueError)]

CASES = (
    [("claim_one", kw, err) for kw, err in BAD_EXACT + BAD_ORDER]
    + [("peek_one", kw, err) for kw, err in BAD_EXACT + BAD_ORDER]
    + [("move_one", kw, err) for kw, err in BAD_EXACT + BAD_ORDER]
    + [("claim_many", kw, err) for kw, err in BAD_BOUNDS + BAD_ORDER]
    + [("peek_many", kw, err) for kw, err in BAD_BOUNDS + BAD_ORDER]
    + [("move_many", kw, err) for kw, err in BAD_BOUNDS + BAD_ORDER]
    + [
        ("claim_many", {"delivery_guarantee": "exactly-once"}, ValueError),
        ("move_many", {"delivery_guarantee": "maybe"}, ValueError),
    ]
)


@pytest.mark.parametrize(("name", "kwargs", "error"), CASES)
def test_bad_arguments_are_rejected_before_any_change(sb, ids, name, kwargs, error):
    with pytest.raises(error):
        _call(sb, name, kwargs)
    assert _pending_ids(sb) == ids
    assert sb.list_queues() == ["q"]


@pytest.mark.parametrize(
    "call",
    [
        lambda sb: sb.claim_many("q", 0),
        lambda sb: sb.claim_many("q", -1),
        lambda sb: sb.peek_many("q", 0),
        lambda sb: sb.move_many("q", "dest", 0),
        lambda sb: sb.move_one("q", "q"),
        lambda sb: sb.move_many("q", "q", 5),
        lambda sb: list(sb.move_generator("q", "q")),
        lambda sb: list(sb.claim_generator("q", delivery_guarantee="never")),
        lambda sb: list(sb.move_generator("q", "dest", delivery_guarantee="never")),
        lambda sb: list(sb.claim_generator("q", after_timestamp=-5)),
        lambda sb: list(sb.peek_generator("q", exact_timestamp="12")),
    ],
    ids=[
        "claim-limit-0",
        "claim-limit-neg",
        "peek-limit-0",
        "move-limit-0",
        "move-one-same",
        "move-many-same",
        "move-gen-same",
        "claim-gen-guarantee",
        "move-gen-guarantee",
        "claim-gen-bound",
        "peek-gen-exact",
    ],
)
def test_bad_limits_guarantees_and_same_queue_moves_raise_value_error(sb, ids, call):
    with pytest.raises(ValueError):
        call(sb)
    assert _pending_ids(sb) == ids
    assert sb.list_queues() == ["q"]


@pytest.mark.parametrize(
    "call",
    [
        lambda sb: sb.claim_one("-q"),
        lambda sb: sb.peek_many("q q"),
        lambda sb: sb.move_one("q", "-dest"),
        lambda sb: sb.move_many("q", "dest!", 3),
        lambda sb: list(sb.move_generator("q", "@dest")),
        lambda sb: list(sb.claim_generator("")),
    ],
    ids=["claim", "peek", "move-target", "move-many-target", "move-gen-target", "gen-source"],
)
def test_invalid_queue_names_are_rejected_before_any_change(sb, ids, call):
    with pytest.raises(QueueNameError):
        call(sb)
    assert _pending_ids(sb) == ids
    assert sb.list_queues() == ["q"]


# -- same-thread mutation while an at_least_once batch is being yielded ------------------

REENTRANT = {
    "write": lambda sb: sb.write("other", "nested"),
    "insert_messages": lambda sb: sb.insert_messages([("other", "nested", 5)]),
    "claim_one": lambda sb: sb.claim_one("q"),
    "move_many": lambda sb: sb.move_many("q", "other", 2),
    "delete": lambda sb: sb.delete("q"),
    "delete_message_ids": lambda sb: sb.delete_message_ids("q", [1]),
    "broadcast": lambda sb: sb.broadcast("nested"),
    "rename_queue": lambda sb: sb.rename_queue("q", "other"),
    "add_alias": lambda sb: sb.add_alias("al", "q"),
    "generate_timestamp": lambda sb: sb.generate_timestamp(),
    "vacuum": lambda sb: sb.vacuum(),
}


@pytest.mark.parametrize(
    ("generator", "name"), [("claim", name) for name in sorted(REENTRANT)] + [("move", "write")]
)
def test_mutation_reentering_an_open_at_least_once_batch_is_rejected(sb, ids, generator, name):
    if generator == "claim":
        gen = sb.claim_generator("q", delivery_guarantee="at_least_once", batch_size=2)
    else:
        gen = sb.move_generator("q", "dest", delivery_guarantee="at_least_once", batch_size=2)
    try:
        assert next(gen) == ("m0", ids[0])
        high_water = sb.refresh_last_timestamp()
        with pytest.raises(RuntimeError, match="separate BrokerDB/Queue instance"):
            REENTRANT[name](sb)
        assert sb.refresh_last_timestamp() == high_water
    finally:
        gen.close()
    # Nothing changed, and closing the generator released its batch.
    assert _pending_ids(sb) == ids
    assert sb.list_queues() == ["q"]
    assert sb.list_aliases() == []


def test_legacy_zero_id_stays_addressable_movable_and_deletable(broker, raw, namespace):
    # ID 0 cannot be inserted any more, but a row from an older release must
    # stay reachable through exact selectors. Plant one in the stored layout.
    keys = Keyspace.for_namespace(namespace)
    zero = "0" * 19
    raw.hset(keys.bodies, zero, "legacy")
    raw.zadd(keys.pending, {f"legacy {zero}": 0})
    raw.zadd(keys.queues, {"legacy": 0})
    assert broker.peek_one("legacy", exact_timestamp=0) == ("legacy", 0)
    assert broker.peek_one("legacy", exact_timestamp=zero) == ("legacy", 0)
    assert broker.peek_many("legacy", after_timestamp=0) == []  # strict lower bound
    assert broker.move_one("legacy", "recovered", exact_timestamp=0) == ("legacy", 0)
    assert broker.list_queues() == ["recovered"]
    assert broker.delete_message_ids("recovered", [zero]) == 1
    assert broker.peek_one("recovered", exact_timestamp=0, include_claimed=True) is None
    assert without_meta(stored(raw, namespace)) == {}
