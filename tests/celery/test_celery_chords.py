"""A chord's body is written together with the chord's ``done`` mark, or not at all.

The header task that completes a chord dispatches the body; its publishes
are staged and committed with the mark by one script
(``celery_chord_dispatch.lua``). These tests stop a dispatch at the worst
moments, in-process (the body already "sent" to the stage, the commit not
run; the commit run but its reply lost), and check the queue: the body is
there exactly once after the header task runs again, however often.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import states

from celery_simplebroker.chords import Chords
from simplebroker_redis import RedisBrokerCore, RedisRunner
from simplebroker_redis.calls import celery as celery_calls


class Died(BaseException):
    """The worker process ends here (nothing after this line of the dispatch runs)."""


@pytest.fixture
def core(redis_url: str, namespace: str):
    runner = RedisRunner(redis_url, namespace=namespace)
    yield RedisBrokerCore(runner)
    runner.shutdown()


def make_chord(app: Any, size: int, failed: int | None = None) -> tuple[list[Any], str]:
    """Start a chord of ``size`` header tasks (part ``failed`` raises); nothing finished yet.

    Return each part's request (its result in ``.result``) and the chord's key name.
    """
    backend = app.backend
    gid = f"g-{id(app)}"
    body = app.signature("collect", queue="bodies")
    body.freeze()
    backend.set_chord_size(gid, size)  # as Celery does when it sends the header's last task
    requests = []
    for index in range(size):
        task_id = f"{gid}-part{index}"
        failure = index == failed
        requests.append(
            SimpleNamespace(
                id=task_id,
                group=gid,
                group_index=index,
                chord=dict(body),
                state=states.FAILURE if failure else states.SUCCESS,
                result=ValueError("boom") if failure else f"k{index}",
            )
        )
    return requests, backend.get_key_for_chord(gid).decode()


def bodies(core: RedisBrokerCore) -> list[list[Any]]:
    """The args of every chord body waiting in the ``bodies`` queue."""
    return [
        json.loads(json.loads(row)["body"])[0]
        for row in core.peek_many("bodies", 100, with_timestamps=False)
    ]


def finish(app: Any, request: Any) -> None:
    app.backend.on_chord_part_return(request, request.state, request.result)


def test_a_dispatch_cut_before_its_commit_sent_nothing_and_runs_again(
    app, core, raw: redis.Redis, monkeypatch
):
    requests, chord = make_chord(app, 3)
    finish(app, requests[0])
    finish(app, requests[1])
    commit = Chords._commit_once

    def die(self: Any, *args: Any) -> bool:
        raise Died()

    monkeypatch.setattr(Chords, "_commit_once", die)
    with pytest.raises(Died):
        finish(app, requests[2])  # joined the header, "sent" the body: staged only
    assert bodies(core) == []
    parts, claim, size, results = celery_calls.chord_keys(core.runner.keys, chord)
    assert raw.get(claim) == f"{requests[2].id}:2"  # the right to dispatch is still its own
    assert raw.scard(parts) == 3 and raw.hlen(results) == 3
    monkeypatch.setattr(Chords, "_commit_once", commit)
    finish(app, requests[0])  # another part again: not the dispatcher
    assert bodies(core) == []
    finish(app, requests[2])  # the header task redelivered: dispatches now
    assert bodies(core) == [[["k0", "k1", "k2"]]]
    assert raw.get(claim) == "done" and raw.exists(parts, size, results) == 0
    for request in requests:  # late duplicates of every part
        finish(app, request)
    assert bodies(core) == [[["k0", "k1", "k2"]]]


def test_a_commit_whose_reply_was_lost_is_retried_without_a_second_body(
    app, core, raw: redis.Redis, monkeypatch, caplog
):
    requests, chord = make_chord(app, 2)
    finish(app, requests[0])
    commit = Chords._commit_once
    calls: list[bool] = []

    def lose_reply(self: Any, *args: Any) -> bool:
        calls.append(commit(self, *args))
        if len(calls) == 1:
            raise redis.ConnectionError("connection lost after the script ran")
        return calls[-1]

    monkeypatch.setattr(Chords, "_commit_once", lose_reply)
    finish(app, requests[1])
    assert calls == [True, False]  # the retry found the chord done and wrote nothing
    assert bodies(core) == [[["k0", "k1"]]]
    assert "marked done already" in caplog.text


def test_the_last_part_dispatches_even_when_no_replica_confirms_it(
    app, core, raw: redis.Redis, celery_url, namespace, events, caplog
):
    """``ReplicationTimeout`` on the count and on the commit: both happened, the body goes once."""
    from celeryapp import make_app

    from simplebroker_redis import ReplicationTimeout

    requests, chord = make_chord(app, 3)
    finish(app, requests[0])
    finish(app, requests[1])
    durable = make_app(celery_url, namespace, str(events))
    durable.conf.result_backend_transport_options = {
        "namespace": namespace,
        "wait_replicas": 5,  # more than any test topology has
        "wait_timeout": 0.05,
    }
    runner = durable.backend.runner
    short: list[str] = []

    def run(call: Any) -> Any:
        try:
            return type(runner).run(runner, call)
        except ReplicationTimeout:
            short.append(call.script)
            raise

    try:
        runner.run = run  # type: ignore[method-assign]
        finish(durable, requests[2])  # neither the count nor the commit is confirmed
    finally:
        durable.close()
    assert short == ["celery_chord_part", "celery_chord_dispatch"]
    assert bodies(core) == [[["k0", "k1", "k2"]]]
    parts, claim, size, results = celery_calls.chord_keys(core.runner.keys, chord)
    assert raw.get(claim) == "done" and raw.exists(parts, size, results) == 0
    assert "commit failed" not in caplog.text  # the commit's own reply was used, not a retry


def test_error_callbacks_of_a_failed_chord_are_committed_with_the_mark(app, core, raw):
    requests, chord = make_chord(app, 2, failed=1)
    errback = app.signature("on_chord_error", queue="bodies")  # sent as a task message
    requests[0].chord["options"]["link_error"] = [dict(errback)]  # shared by every part
    finish(app, requests[0])
    finish(app, requests[1])  # the header failed: errbacks instead of the body
    finish(app, requests[1])
    _, claim, _, _ = celery_calls.chord_keys(core.runner.keys, chord)
    assert raw.get(claim) == "done"
    rows = core.peek_many("bodies", 100, with_timestamps=False)
    assert [json.loads(row)["headers"]["task"] for row in rows] == ["on_chord_error"]


def test_a_frozen_chord_applied_again_counts_an_entry_finished_before_its_size(
    app, core, raw: redis.Redis
):
    """A second run's first entry can finish before Celery sends the last one.

    Celery calls ``apply_chord`` before it sends the header and
    ``set_chord_size`` just before the last task: a fast worker finishes the
    first entry in between. That entry must count for the new run, not be
    taken for a late copy of the previous run's (whose ``done`` mark the
    group ID shares).
    """
    requests, chord = make_chord(app, 2)
    gid = requests[0].group
    header = (gid, [app.AsyncResult(request.id) for request in requests])
    for run in (1, 2):
        app.backend.apply_chord(header, None)  # Celery, before sending the header
        finish(app, requests[0])  # the first entry runs before the last is sent
        app.backend.set_chord_size(gid, 2)  # Celery, as it sends the last one
        finish(app, requests[1])
        assert bodies(core) == [[["k0", "k1"]]] * run
    finish(app, requests[0])  # a late copy of the second run's entry
    assert bodies(core) == [[["k0", "k1"]]] * 2
    assert raw.get(celery_calls.chord_keys(core.runner.keys, chord)[1]) == "done"
