"""The worker's group commit: results and acknowledgements in one ``commit`` script."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from simplebroker_redis import AsyncLeases, AsyncMessages, AsyncRedisRunner
from simplebroker_redis.calls import Call
from support.recording import record_scripts
from taskiq_simplebroker.commit import Committer, ResultWrite


async def reserve(runner: AsyncRedisRunner, queue: str, bodies: list[str]) -> Any:
    messages = AsyncMessages(runner)
    for body in bodies:
        await messages.write(queue, body)
    return await AsyncLeases(runner).reserve(queue, len(bodies), 30)


async def test_results_acks_and_dead_letters_of_many_tasks_go_in_one_script(
    arunner, raw, namespace, broker
):
    first = await reserve(arunner, "tasks", ["a", "b", "c"])
    second = await reserve(arunner, "tasks", ["d"])
    scripts = record_scripts(arunner)
    committer = Committer(arunner)
    keys = arunner.keys
    writes = [
        ResultWrite(keys.result_key("t1"), '{"v": 1}', None),
        ResultWrite(keys.result_key("t2"), '{"v": 2}', 60_000),
    ]
    ids = first.ids
    # Submitted in one go (no await between): one batch.
    done = [
        committer.submit(writes[:1], first.token, ids[0]),
        committer.submit(writes[1:], first.token, ids[1]),
        committer.submit((), first.token, ids[2], "tasks.dead"),
        committer.submit((), second.token, second.ids[0]),
    ]
    await asyncio.gather(*done)
    assert scripts == ["commit"]
    assert raw.get(keys.result_key("t1")) == '{"v": 1}'
    assert raw.pttl(keys.result_key("t1")) == -1
    assert 0 < raw.pttl(keys.result_key("t2")) <= 60_000
    # a, b, d deleted; c moved to the dead-letter queue under the same ID.
    assert broker.peek_many("tasks", 10) == []
    assert broker.peek_many("tasks.dead", 10, with_timestamps=True) == [("c", ids[2])]
    assert raw.hlen(f"sb:{{{namespace}}}:tokens") == 0
    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 0
    assert raw.hlen(f"sb:{{{namespace}}}:bodies") == 1


async def test_a_lost_lease_refuses_the_fenced_result_and_keeps_the_newer_reservation(
    arunner, raw, namespace, caplog
):
    lease = await reserve(arunner, "tasks", ["a"])
    leases = AsyncLeases(arunner)
    # The lease is lost: released (as recovery does) and reserved by someone else.
    await leases.release(lease.token, None)
    newer = await leases.reserve("tasks", 1, 30)
    assert newer.ids == lease.ids
    key = arunner.keys.result_key("late")
    raw.set(key, "the newer holder's")
    committer = Committer(arunner)
    stale = ResultWrite(key, "stale", None, fence=(lease.token, lease.ids[0]))
    unfenced = ResultWrite(arunner.keys.result_key("other"), "kept", None)
    with caplog.at_level(logging.WARNING, logger="taskiq_simplebroker"):
        await committer.submit([stale, unfenced], lease.token, lease.ids[0])
    assert raw.get(key) == "the newer holder's"
    assert raw.get(arunner.keys.result_key("other")) == "kept"  # no fence: stored
    assert "1 result(s) not stored" in caplog.text
    assert "1 acknowledgement(s) refused" in caplog.text
    # The newer holder still owns the message, and its fenced result is stored.
    assert raw.hget(f"sb:{{{namespace}}}:owners", f"{lease.ids[0]:019d}") == newer.token
    fresh = ResultWrite(key, "newer", None, fence=(newer.token, newer.ids[0]))
    await committer.submit([fresh], newer.token, newer.ids[0])
    assert raw.get(key) == "newer"


async def test_an_unconfirmed_commit_is_saved_and_reported_as_unconfirmed(
    arunner, raw, namespace, redis_url, caplog
):
    """``ReplicationTimeout`` on every try: saved and acknowledged, and the log says so."""
    lease = await reserve(arunner, "tasks", ["a"])
    durable = AsyncRedisRunner(redis_url, namespace=namespace, wait_replicas=5, wait_timeout=0.05)
    committer = Committer(durable, retry_seconds=0.4)
    key = arunner.keys.result_key("unconfirmed")
    try:
        with caplog.at_level(logging.WARNING, logger="taskiq_simplebroker"):
            await committer.submit([ResultWrite(key, "done", None)], lease.token, lease.ids[0])
    finally:
        await durable.aclose()
    assert raw.get(key) == "done"
    assert raw.hlen(f"sb:{{{namespace}}}:bodies") == 0  # acknowledged: gone
    assert "saving results failed, retrying" in caplog.text  # the repeats wait for replicas
    assert "acknowledged 1 task(s) on the primary, but no replica confirmed it" in caplog.text
    assert "refused" not in caplog.text
    assert "gave up" not in caplog.text


async def test_an_invalid_commit_is_refused_before_anything_is_written(arunner, raw):
    lease = await reserve(arunner, "tasks", ["a"])
    key = arunner.keys.result_key("never")
    id_arg = f"{lease.ids[0]:019d}"
    bad = [
        [1, "v", "", "", "", lease.token, "explode", "", 1, id_arg],  # unknown mode
        [1, "v", "", "", "", lease.token, "move", "tasks", 1, id_arg],  # move to its own queue
        [1, "v", "", "", "", lease.token, "delete", "", 5, id_arg],  # count beyond the arguments
        [1, "v", "-5", "", "", lease.token, "delete", "", 1, id_arg],  # bad expiry
        [1, "v", "", lease.token, "x", lease.token, "delete", "", 1, id_arg],  # bad fence
    ]
    for args in bad:
        with pytest.raises(ValueError):
            await arunner.run(Call(list, "commit", tuple(args), extra_keys=(key,)))
        assert raw.exists(key) == 0
    # The reservation is untouched: the same commit with good arguments settles it.
    good = (1, "v", "", lease.token, id_arg, lease.token, "delete", "", 1, id_arg)
    reply = await arunner.run(Call(list, "commit", good, extra_keys=(key,)))
    assert [int(n) for n in reply] == [0, 1, 0]
    assert raw.get(key) == "v"


async def test_commit_survives_a_script_cache_flush(arunner, raw):
    lease = await reserve(arunner, "tasks", ["a"])
    raw.script_flush()
    committer = Committer(arunner)
    key = arunner.keys.result_key("after-flush")
    await committer.submit([ResultWrite(key, "ok", None)], lease.token, lease.ids[0])
    assert raw.get(key) == "ok"
    assert raw.zcard(f"sb:{{{arunner.keys.namespace}}}:reserved") == 0


async def test_a_damaged_reservation_does_not_hold_back_the_rest_of_the_batch(
    arunner, raw, namespace, caplog
):
    good = await reserve(arunner, "tasks", ["a"])
    damaged = await reserve(arunner, "tasks", ["b"])
    raw.hset(f"sb:{{{namespace}}}:tokens", damaged.token, "not json")
    committer = Committer(arunner)
    keys = arunner.keys
    with caplog.at_level(logging.WARNING, logger="taskiq_simplebroker"):
        await asyncio.gather(
            committer.submit(
                [ResultWrite(keys.result_key("g"), "1", None)], good.token, good.ids[0]
            ),
            committer.submit(
                [ResultWrite(keys.result_key("d"), "2", None)], damaged.token, damaged.ids[0]
            ),
        )
    assert raw.get(keys.result_key("g")) == "1"
    assert raw.get(keys.result_key("d")) == "2"
    assert "1 acknowledgement(s) refused" in caplog.text
    # The good task is acknowledged; the damaged reservation still holds its message.
    assert raw.zrange(f"sb:{{{namespace}}}:reserved", 0, -1) == [f"tasks {damaged.ids[0]:019d}"]
