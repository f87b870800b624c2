"""The result backend in-process: a succeeded task keeps its result; results expire."""

from __future__ import annotations

import pytest
import redis
from celery import states
from celery.result import AsyncResult

from simplebroker_redis.calls import celery as celery_calls


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_a_task_that_succeeded_keeps_its_result_when_it_runs_again(app, serializer):
    """Celery's guard against a second run overwriting SUCCESS (atomic for JSON)."""
    app.conf.result_serializer = serializer
    app.conf.accept_content = ["json", "pickle"]
    backend = app.backend
    backend.store_result("t1", {"n": 1}, states.STARTED)
    backend.store_result("t1", {"n": 2}, states.SUCCESS)  # a later state replaces STARTED
    backend.store_result("t1", ValueError("second run"), states.FAILURE)
    result = AsyncResult("t1", app=app)
    assert result.state == states.SUCCESS
    assert result.get(timeout=10) == {"n": 2}


def test_results_expire_after_result_expires(app, raw: redis.Redis, namespace):
    app.conf.result_expires = 2
    backend = app.backend
    backend.store_result("t2", 7, states.SUCCESS)
    key = celery_calls.entry_key(backend.runner.keys, "celery-task-meta-t2")
    assert 0 < raw.pttl(key) <= 2000
    assert AsyncResult("t2", app=app).get(timeout=10) == 7


def test_a_saved_group_is_restored_and_deleted(app):
    """GroupResult.save()/restore()/delete(), which Celery users call by group id."""
    from celery.result import GroupResult

    children = [AsyncResult(f"member-{i}", app=app) for i in range(3)]
    for i, child in enumerate(children):
        app.backend.store_result(child.id, i * 10, states.SUCCESS)
    GroupResult("saved-group", children, app=app).save()
    restored = GroupResult.restore("saved-group", app=app)
    assert restored is not None
    assert [child.id for child in restored.results] == ["member-0", "member-1", "member-2"]
    assert restored.get(timeout=10) == [0, 10, 20]
    restored.delete()
    assert GroupResult.restore("saved-group", app=app) is None


def test_extended_results_carry_the_tasks_name_arguments_worker_and_queue(app):
    from celery.app.task import Context

    app.conf.result_extended = True
    request = Context(
        id="extended",
        task="add",
        args=[2, 3],
        kwargs={"scale": 1},
        hostname="w1@host",
        retries=1,
        delivery_info={"routing_key": "celery"},
    )
    app.backend.store_result("extended", 5, states.SUCCESS, request=request)
    result = AsyncResult("extended", app=app)
    assert result.get(timeout=10) == 5
    assert (result.name, result.args, result.kwargs) == ("add", [2, 3], {"scale": 1})
    assert (result.worker, result.retries, result.queue) == ("w1@host", 1, "celery")
    assert result.date_done is not None


def _reserved(runner, queue: str = "tasks"):
    """Write one message to ``queue`` and reserve it: (leases, lease)."""
    from simplebroker_redis import Leases, RedisBrokerCore

    RedisBrokerCore(runner).write(queue, "task body")
    leases = Leases(runner)
    lease = leases.reserve(queue, 1, 30.0)
    assert len(lease.messages) == 1
    return leases, lease


def _store(runner, name: str, value: str, ack):
    from simplebroker_redis import calls

    return runner.run(
        calls.celery_store(runner.keys, name, value, None, None, guard=True, fence=ack, ack=True)
    )


def _total(runner, queue: str = "tasks") -> int:
    from simplebroker_redis import RedisBrokerCore

    return RedisBrokerCore(runner).get_queue_stat(queue).total


def test_storing_a_result_can_delete_the_task_message_in_the_same_step(runner, raw):
    _, lease = _reserved(runner)
    ack = (lease.token, lease.messages[0].id)
    value = '{"status": "SUCCESS", "result": 1}'
    outcome = _store(runner, "celery-task-meta-a", value, ack)
    assert (outcome.stored, outcome.settlement.settled, outcome.settlement.lost) == (1, 1, 0)
    assert _total(runner) == 0
    assert raw.get(celery_calls.entry_key(runner.keys, "celery-task-meta-a")) == value
    # The same store again (a retry whose first reply was lost): kept, nothing to delete.
    again = _store(runner, "celery-task-meta-a", value, ack)
    assert (again.stored, again.settlement.settled, again.settlement.lost) == (0, 0, 1)
    # Another result under the settled token (a stale run): fenced, nothing stored.
    stale = _store(runner, "celery-task-meta-a", '{"status": "FAILURE"}', ack)
    assert (stale.stored, stale.settlement.settled, stale.settlement.lost) == (-2, 0, 1)
    assert raw.get(celery_calls.entry_key(runner.keys, "celery-task-meta-a")) == value


def test_a_fenced_result_is_stored_only_while_its_reservation_holds_the_message(runner, raw):
    """A stale worker (its lease taken over) never overwrites the current holder's result."""
    from simplebroker_redis import calls

    leases, lease = _reserved(runner)
    fence = (lease.token, lease.messages[0].id)
    key = celery_calls.entry_key(runner.keys, "celery-task-meta-f")

    def store(value: str, fenced_by: tuple[str, int]):
        call = calls.celery_store(
            runner.keys, "celery-task-meta-f", value, None, None, guard=True, fence=fenced_by
        )
        return runner.run(call)

    assert store('{"status": "STARTED"}', fence).stored == 1  # held: stored, not acknowledged
    assert _total(runner) == 1
    leases.release(lease.token, [lease.messages[0].id])  # handed back: another worker takes it
    heir = leases.reserve("tasks", 1, 30.0)
    assert (
        store('{"status": "SUCCESS", "result": "heir"}', (heir.token, heir.messages[0].id)).stored
        == 1
    )
    late = store('{"status": "SUCCESS", "result": "stale"}', fence)
    assert (late.stored, late.settlement.settled, late.settlement.lost) == (-2, 0, 1)
    assert raw.get(key) == '{"status": "SUCCESS", "result": "heir"}'
    assert _total(runner) == 1  # nothing acknowledged for the stale worker


def test_a_result_stored_under_a_lapsed_lease_renews_it_so_no_recovery_runs_it_again(runner, raw):
    """A prefork store that landed past the lease, before any recovery (issue 42).

    The pool process's store (fenced, without the acknowledgement, which
    the worker's main process sends next) renews the reservation: a
    recovery pass between the two must not hand the finished task to
    another worker.
    """
    import time

    from simplebroker_redis import Leases, RedisBrokerCore, calls

    RedisBrokerCore(runner).write("tasks", "task body")
    leases = Leases(runner)
    lease = leases.reserve("tasks", 1, 0.2)
    message = lease.messages[0].id
    time.sleep(0.3)  # the lease lapses; nobody recovers it yet
    call = calls.celery_store(
        runner.keys,
        "celery-task-meta-r",
        '{"status": "SUCCESS", "result": 1}',
        None,
        None,
        guard=True,
        fence=(lease.token, message),
    )
    assert runner.run(call).stored == 1
    assert leases.recover().tokens == 0  # renewed by the store: not stale
    assert leases.ack(lease.token, [message], delete=True).settled == 1  # the main process's ack
    assert _total(runner) == 0


def _store_ahead(runner, name: str, ack, sources, limit: int):
    from simplebroker_redis import calls

    call = calls.celery_store(
        runner.keys,
        name,
        '{"status": "SUCCESS", "result": 1}',
        None,
        None,
        guard=True,
        fence=ack,
        ack=True,
        reserve_from=sources,
        reserve_limit=limit,
        lease_seconds=30.0,
    )
    return runner.run(call)


def test_a_result_can_reserve_the_next_messages_in_the_same_step(runner, raw):
    """A solo worker's next batch comes with its task's result: one round trip for both."""
    from simplebroker_redis import Leases, RedisBrokerCore

    _, lease = _reserved(runner)
    core = RedisBrokerCore(runner)
    for body in ("high", "low1", "low2", "low3"):
        core.write("tasks.p9" if body == "high" else "tasks", body)
    ack = (lease.token, lease.messages[0].id)
    outcome = _store_ahead(
        runner, "celery-task-meta-n", ack, [("tasks.p9", None), ("tasks", None)], 3
    )
    assert (outcome.stored, outcome.settlement.settled, outcome.settlement.lost) == (1, 1, 0)
    assert outcome.reserved is not None
    assert [m.body for m in outcome.reserved.messages] == ["high", "low1", "low2"]
    assert [lease.queue for lease in outcome.reserved.leases] == ["tasks.p9", "tasks"]
    assert outcome.reserved.deadline_ns is not None
    # Reserved as reserve_queues reserves: held (not claimable), settled with their tokens.
    assert [m.body for m in Leases(runner).reserve("tasks", 10, 30.0).messages] == ["low3"]
    for taken in outcome.reserved.leases:
        ids = [m.id for m in taken.messages]
        assert Leases(runner).ack(taken.token, ids, delete=True).settled == len(ids)
    assert _total(runner, "tasks.p9") == 0


def test_a_result_that_changes_nothing_reserves_nothing(runner, raw):
    """The guard cannot read the stored entry: no result, no acknowledgement, no reservation."""
    from simplebroker_redis import RedisBrokerCore

    raw.set(celery_calls.entry_key(runner.keys, "celery-task-meta-u"), "\x80pickled")
    _, lease = _reserved(runner)
    RedisBrokerCore(runner).write("tasks", "next")
    ack = (lease.token, lease.messages[0].id)
    outcome = _store_ahead(runner, "celery-task-meta-u", ack, [("tasks", None)], 4)
    assert (outcome.stored, outcome.reserved) == (-1, None)
    assert _total(runner) == 2
    assert RedisBrokerCore(runner).peek_many("tasks", 5, with_timestamps=False) == [
        "task body",
        "next",
    ]


def test_reserving_with_a_result_needs_its_acknowledgement(runner):
    from simplebroker_redis import calls

    with pytest.raises(ValueError, match="acknowledgement"):
        calls.celery_store(
            runner.keys,
            "k",
            "v",
            None,
            None,
            guard=True,
            reserve_from=[("tasks", None)],
            reserve_limit=1,
        )


def test_a_kept_result_still_acknowledges_the_rerun_task(runner, raw):
    raw.set(
        celery_calls.entry_key(runner.keys, "celery-task-meta-b"),
        '{"status": "SUCCESS", "result": 1}',
    )
    _, lease = _reserved(runner)
    outcome = _store(
        runner,
        "celery-task-meta-b",
        '{"status": "SUCCESS", "result": 2}',
        (lease.token, lease.messages[0].id),
    )
    assert (outcome.stored, outcome.settlement.settled) == (0, 1)
    assert _total(runner) == 0
    assert '"result": 1' in raw.get(celery_calls.entry_key(runner.keys, "celery-task-meta-b"))


def test_an_unreadable_stored_entry_leaves_result_and_message_alone(runner, raw):
    """The guard cannot read another serializer's entry: nothing is done, nothing acknowledged."""
    key = celery_calls.entry_key(runner.keys, "celery-task-meta-c")
    raw.set(key, "\x80pickled")
    _, lease = _reserved(runner)
    outcome = _store(
        runner, "celery-task-meta-c", '{"status": "SUCCESS"}', (lease.token, lease.messages[0].id)
    )
    assert (outcome.stored, outcome.settlement.settled, outcome.settlement.lost) == (-1, 0, 0)
    assert raw.get(key) == "\x80pickled"
    assert _total(runner) == 1


def test_a_wrong_typed_result_key_refuses_before_acknowledging(runner, raw):
    from simplebroker.ext import DataError

    key = celery_calls.entry_key(runner.keys, "celery-task-meta-d")
    raw.rpush(key, "not a string")
    leases, lease = _reserved(runner)
    with pytest.raises(DataError, match="celery-task-meta-d"):
        _store(
            runner,
            "celery-task-meta-d",
            '{"status": "SUCCESS"}',
            (lease.token, lease.messages[0].id),
        )
    assert _total(runner) == 1  # still reserved by its token
    assert leases.ack(lease.token, None, delete=True).settled == 1


def test_a_result_under_a_lost_reservation_is_refused_and_acknowledges_nothing(runner, raw):
    """The worker's lease was taken over: its late result is fenced (issue 42)."""
    _, lease = _reserved(runner)
    outcome = _store(
        runner,
        "celery-task-meta-e",
        '{"status": "SUCCESS"}',
        ("no-such-token", lease.messages[0].id),
    )
    assert (outcome.stored, outcome.settlement.settled, outcome.settlement.lost) == (-2, 0, 1)
    assert raw.get(celery_calls.entry_key(runner.keys, "celery-task-meta-e")) is None
    assert _total(runner) == 1  # its own token still holds it


def test_durability_options_reach_every_write_of_the_result_backend(redis_url, namespace, raw):
    """``wait_replicas`` is passed through: each write, scripts and plain commands, WAITs."""
    from celery import Celery

    from simplebroker_redis import ReplicationTimeout

    app = Celery("durable", backend=f"simplebroker+{redis_url}")
    app.conf.result_backend_transport_options = {
        "namespace": namespace,
        "wait_replicas": 1,  # the test server has no replica
        "wait_timeout": 0.1,
    }
    backend = app.backend
    try:
        with pytest.raises(ReplicationTimeout, match="happened.*0 of 1 replicas"):
            backend.store_result("t3", 3, states.SUCCESS)  # celery_store.lua
        key = celery_calls.entry_key(backend.runner.keys, "celery-task-meta-t3")
        assert raw.get(key) is not None  # it happened
        with pytest.raises(ReplicationTimeout):
            backend.expire("celery-task-meta-t3", 60)  # a plain EXPIRE
        assert 0 < raw.ttl(key) <= 60
        with pytest.raises(ReplicationTimeout):
            backend.delete("celery-task-meta-t3")
        assert raw.get(key) is None
        assert backend.get("celery-task-meta-t3") is None  # reads do not wait
    finally:
        app.close()


def test_an_invalid_passed_backend_option_is_refused_with_its_name(redis_url, namespace):
    from celery import Celery
    from simplebroker.ext import BrokerError

    app = Celery("bad", backend=f"simplebroker+{redis_url}")
    app.conf.result_backend_transport_options = {"namespace": namespace, "wait_replicas": -1}
    with pytest.raises(BrokerError, match="wait_replicas"):
        app.backend  # noqa: B018 - building it validates the options


def test_unknown_result_backend_options_are_named_in_a_warning(
    redis_url, namespace, caplog, monkeypatch
):
    from celery import Celery

    from celery_simplebroker import options as options_module

    monkeypatch.setattr(options_module, "_warned", set())
    caplog.set_level("WARNING", logger="celery_simplebroker")
    app = Celery("typo", backend=f"simplebroker+{redis_url}")
    app.conf.result_backend_transport_options = {
        "namespace": namespace,
        "max_conections": 4,  # a typo
        "global_keyprefix": "app:",  # Celery's own: known
    }
    try:
        app.backend.store_result("t4", 4, states.SUCCESS)
        assert AsyncResult("t4", app=app).get(timeout=10) == 4
    finally:
        app.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "celery_simplebroker"]
    assert warnings == [
        "result_backend_transport_options: 'max_conections' is not an option of"
        " celery_simplebroker (ignored); did you mean 'max_connections'?"
    ]
