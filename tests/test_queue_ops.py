"""Queue-level operations: delete, search, listing, stats, probes, vacuum, lifecycle."""

from __future__ import annotations

import pickle

import pytest
from simplebroker.ext import OperationalError, QueueNameError, SidecarUnavailableError
from simplebroker.metadata import QueueStats

from simplebroker_redis import RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from support.state import stored, without_meta

#: Run on a single server, a Redis Cluster and a Sentinel group (conftest.py).
TOPOLOGIES = ("single", "cluster", "sentinel")


@pytest.fixture
def layout(sb) -> dict[str, list[int]]:
    """Queues a (5, first claimed), b (3), c (1, claimed only)."""
    made = {
        "a": [sb.write("a", f"a{i}") for i in range(5)],
        "b": [sb.write("b", f"b{i}") for i in range(3)],
        "c": [sb.write("c", "c0")],
    }
    sb.claim_one("a")
    sb.claim_one("c")
    return made


# -- delete --------------------------------------------------------------------------


def test_delete_one_queue_counts_claimed_rows_too(sb, layout):
    assert sb.delete("a") == 5
    assert sb.list_queues() == ["b", "c"]
    assert sb.delete("a") == 0
    assert sb.delete("never") == 0
    with pytest.raises(QueueNameError):
        sb.delete("-bad")
    assert sb.get_overall_stats() == (1, 4)


def test_delete_everything(sb, layout):
    assert sb.delete() == 9
    assert sb.list_queues() == []
    assert sb.get_overall_stats() == (0, 0)
    # The high-water mark survives deletion: new IDs stay above old ones.
    assert sb.write("a", "again") > layout["c"][0]


def test_delete_message_ids_ignores_missing_and_foreign_ids(sb, layout):
    a, b = layout["a"], layout["b"]
    deleted = sb.delete_message_ids("a", [a[0], f"{a[1]:019d}", a[1], b[0], 12345, a[4]])
    assert deleted == 3  # a0 (claimed), a1, a4; b0 belongs to another queue
    assert [ts for _, ts in sb.peek_many("a", include_claimed=True)] == a[2:4]
    assert sb.get_queue_stat("b").pending == 3
    assert sb.delete_message_ids("a", []) == 0


@pytest.mark.parametrize(
    ("bad_id", "error"),
    [("12", ValueError), (True, TypeError), (-3, ValueError), (2**63, ValueError)],
)
def test_delete_message_ids_validates_every_id_first(sb, layout, bad_id, error):
    with pytest.raises(error):
        sb.delete_message_ids("a", [layout["a"][1], bad_id])
    assert sb.get_queue_stat("a").total == 5


def test_delete_from_queues_with_strict_before_bound(sb, layout):
    a = layout["a"]
    assert sb.delete_from_queues(["a", "b", "missing", "a"], before_timestamp=a[2]) == 2
    assert [ts for _, ts in sb.peek_many("a", include_claimed=True)] == a[2:]
    assert sb.delete_from_queues(["b", "c"]) == 4
    assert sb.list_queues() == ["a"]
    assert sb.delete_from_queues([]) == 0


@pytest.mark.parametrize(
    ("names", "kwargs", "error"),
    [
        ("ab", {}, TypeError),
        (b"ab", {}, TypeError),
        (["a", "-bad"], {}, QueueNameError),
        (["a"], {"before_timestamp": -1}, ValueError),
        (["a"], {"before_timestamp": "5"}, TypeError),
    ],
)
def test_delete_from_queues_validates_before_deleting(sb, layout, names, kwargs, error):
    with pytest.raises(error):
        sb.delete_from_queues(names, **kwargs)
    assert sb.get_overall_stats() == (2, 9)


# -- find_message_ids -------------------------------------------------------------------


def test_find_message_ids_by_literal_substring(sb):
    ids = [sb.write("q", f"m{i} needle" if i % 2 else f"m{i} hay") for i in range(6)]
    sb.claim_one("q", exact_timestamp=ids[1])
    sb.write("other", "needle elsewhere")
    assert sb.find_message_ids("q", body_contains="needle") == [ids[3], ids[5]]
    assert sb.find_message_ids("q", body_contains="needle", include_claimed=True) == [
        ids[1],
        ids[3],
        ids[5],
    ]
    assert sb.find_message_ids("q", body_contains="needle", limit=1) == [ids[3]]
    assert sb.find_message_ids("q", body_contains="needle", after_timestamp=ids[3]) == [ids[5]]
    assert sb.find_message_ids("q", body_contains="needle", before_timestamp=ids[5]) == [ids[3]]
    assert sb.find_message_ids("q", body_contains="%_*") == []
    assert sb.find_message_ids("q", body_contains="m2 h") == [ids[2]]


def test_find_message_ids_scans_past_the_first_chunk(sb):
    records = [
        ("q", f"row {i}" + (" target" if i % 150 == 7 else ""), 1000 + i) for i in range(1600)
    ]
    sb.insert_messages(records)
    expected = [1000 + i for i in range(1600) if i % 150 == 7]
    assert len(expected) == 11
    assert sb.find_message_ids("q", body_contains="target") == expected
    assert sb.find_message_ids("q", body_contains="target", limit=4) == expected[:4]
    assert sb.find_message_ids("q", body_contains="target", after_timestamp=expected[9]) == [
        expected[10]
    ]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"body_contains": "ab"}, ValueError),
        ({"body_contains": "  a b  "}, ValueError),
        ({"body_contains": 123}, TypeError),
        ({"body_contains": "abc", "limit": 0}, ValueError),
        ({"body_contains": "abc", "limit": True}, TypeError),
        ({"body_contains": "abc", "after_timestamp": -1}, ValueError),
    ],
)
def test_find_message_ids_validation(sb, kwargs, error):
    sb.write("q", "abc")
    with pytest.raises(error):
        sb.find_message_ids("q", **kwargs)


# -- listing and stats --------------------------------------------------------------------


def test_list_queues_prefix_and_pattern(sb):
    for name in ("a1", "a2", "a.x", "a-y", "ab", "b1", "_z", "A1"):
        sb.write(name, "x")
    sb.claim_one("b1")  # claimed-only queues are still listed
    assert sb.list_queues() == ["A1", "_z", "a-y", "a.x", "a1", "a2", "ab", "b1"]
    assert sb.list_queues(prefix="a") == ["a-y", "a.x", "a1", "a2", "ab"]
    assert sb.list_queues(prefix="a.") == ["a.x"]
    assert sb.list_queues(prefix="") == sb.list_queues()
    assert sb.list_queues(pattern="a?") == ["a1", "a2", "ab"]
    assert sb.list_queues(pattern="*1") == ["A1", "a1", "b1"]
    assert sb.list_queues(pattern="[ab]1") == ["a1", "b1"]
    assert sb.list_queues(pattern="*-*") == ["a-y"]
    assert sb.list_queues(pattern="a*") == ["a-y", "a.x", "a1", "a2", "ab"]
    assert sb.list_queues(pattern="zz*") == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefix": "a", "pattern": "a*"},
        {"prefix": "-a"},
        {"prefix": ".a"},
        {"prefix": "a b"},
        {"prefix": "x" * 513},
        {"pattern": "-*"},
        {"pattern": "a b*"},
    ],
)
def test_list_queues_rejects_bad_filters(sb, kwargs):
    sb.write("a", "x")
    with pytest.raises(ValueError):
        sb.list_queues(**kwargs)
    with pytest.raises(ValueError):
        sb.list_queue_stats(**kwargs)


def test_stats_family(sb, layout):
    assert sb.get_queue_stats() == [("a", 4, 5), ("b", 3, 3), ("c", 0, 1)]
    assert sb.get_queue_stat("a") == QueueStats("a", 4, 1, 5)
    assert sb.get_queue_stat("missing") == QueueStats("missing", 0, 0, 0)
    assert sb.list_queue_stats() == [
        QueueStats("a", 4, 1, 5),
        QueueStats("b", 3, 0, 3),
        QueueStats("c", 0, 1, 1),
    ]
    assert sb.list_queue_stats(prefix="b") == [QueueStats("b", 3, 0, 3)]
    assert sb.list_queue_stats(pattern="[ac]") == [
        QueueStats("a", 4, 1, 5),
        QueueStats("c", 0, 1, 1),
    ]
    assert sb.get_overall_stats() == (2, 9)
    assert sb.count_claimed_messages() == 2
    status = sb.status()
    assert status["total_messages"] == 9
    assert status["last_timestamp"] == layout["c"][0] == sb.refresh_last_timestamp()
    with pytest.raises(QueueNameError):
        sb.get_queue_stat("bad name")


def test_queue_probes(sb, layout):
    a = layout["a"]
    assert sb.queue_exists("c") and sb.queue_exists_and_has_messages("c")  # claimed only
    assert not sb.has_pending_messages("c")
    assert sb.latest_pending_timestamp("c") is None
    assert sb.has_pending_messages("a")
    assert sb.has_pending_messages("a", after_timestamp=a[3])
    assert not sb.has_pending_messages("a", after_timestamp=a[4])  # strict
    assert sb.latest_pending_timestamp("a") == a[4]
    sb.claim_one("a", order="newest")
    assert sb.latest_pending_timestamp("a") == a[3]
    assert not sb.queue_exists("missing")
    assert not sb.has_pending_messages("missing")
    assert sb.latest_pending_timestamp("missing") is None
    for probe in (sb.queue_exists, sb.queue_exists_and_has_messages, sb.has_pending_messages):
        with pytest.raises(QueueNameError):
            probe("")
    with pytest.raises(ValueError):
        sb.has_pending_messages("a", after_timestamp=-1)


@pytest.mark.parametrize("compact", [False, True])
def test_vacuum_removes_claimed_rows_and_claimed_only_queues(sb, layout, compact):
    sb.vacuum(compact=compact)
    assert sb.count_claimed_messages() == 0
    assert sb.list_queues() == ["a", "b"]
    assert not sb.queue_exists("c")
    assert sb.get_queue_stat("a") == QueueStats("a", 4, 0, 4)
    assert sb.peek_many("a", include_claimed=True, with_timestamps=False) == [
        "a1",
        "a2",
        "a3",
        "a4",
    ]


def test_automatic_vacuum_runs_every_interval(open_core):
    auto = open_core(AUTO_VACUUM=1, AUTO_VACUUM_INTERVAL=4)
    for i in range(2):
        auto.write("q", f"m{i}")
    assert auto.count_claimed_messages() == 0
    auto.claim_one("q")
    assert auto.count_claimed_messages() == 1
    auto.claim_one("q")  # fourth committed message: maintenance is due
    # SQLite runs it at once; Redis lets the next write/claim carry it (no
    # extra round trip). The schedule itself is SimpleBroker's either way.
    assert auto.claim_one("q") is None
    assert auto.count_claimed_messages() == 0
    assert auto.list_queues() == []


# -- redis-specific surfaces ---------------------------------------------------------------


def test_redis_status_meta_and_data_version(broker):
    written = broker.write("q", "x")
    assert broker.get_data_version() is None
    meta = broker.get_meta()
    assert meta == {
        "magic": "simplebroker-redis",
        "schema_version": 1,
        "last_ts": written,
        "alias_version": 0,
    }
    status = broker.status()
    assert status["total_messages"] == 1
    assert status["last_timestamp"] == written


def test_redis_status_reports_no_database_file(broker):
    # SimpleBroker documents db_size as the on-disk size of the database
    # file; a Redis target has none, and the shared suite expects 0 for redis.
    broker.write("q", "x")
    assert broker.status()["db_size"] == 0


def test_sidecar_is_unavailable_on_redis(broker):
    with pytest.raises(SidecarUnavailableError):
        broker.sidecar()
    with pytest.raises(SidecarUnavailableError):
        broker.sidecar(transaction=True)


def test_cores_cannot_be_pickled(broker):
    with pytest.raises(TypeError):
        pickle.dumps(broker)


def test_vacuum_leaves_only_live_rows_in_storage(broker, raw, namespace):
    broker.write("q", "done")
    live = broker.write("q", "live")
    broker.write("gone", "x")
    broker.claim_one("q")
    broker.claim_one("gone")
    broker.vacuum()
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["q"],
        "pending": [f"q {live:019d}"],
        "bodies": {f"{live:019d}": "live"},
    }


def test_close_and_shutdown_respect_runner_ownership(redis_url, namespace):
    options = {"namespace": namespace}
    shared = redis_backend_plugin.create_core(redis_url, backend_options=options)
    shared.write("q", "x")
    shared.close()
    shared.shutdown()  # borrowed process-wide runner stays open
    again = redis_backend_plugin.create_core(redis_url, backend_options=options)
    assert again.peek_one("q", with_timestamps=False) == "x"

    owned = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace), owns_runner=True)
    assert owned.peek_one("q", with_timestamps=False) == "x"
    owned.shutdown()
    with pytest.raises(OperationalError):
        owned.peek_one("q")

    runner = RedisRunner(redis_url, namespace=namespace)
    borrowed = RedisBrokerCore(runner)
    with borrowed as entered:
        assert entered is borrowed
    borrowed.shutdown()
    assert RedisBrokerCore(runner).peek_one("q", with_timestamps=False) == "x"
    runner.shutdown()
