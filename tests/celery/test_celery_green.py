"""``celery worker -P gevent`` and ``-P eventlet``: tasks side by side, leases renewed, a
killed worker's tasks return.

Celery's command line monkey-patches the process before the app is
imported, so the transport's heartbeat and wake-up threads, its locks and
its sockets all become green (the dev extra installs gevent and eventlet;
eventlet's patching also removes ``select.poll``, which the wake-up
listener then does without). These are real workers on the session's
server, as in the rest of this directory.
"""

from __future__ import annotations

import time

import pytest
from celery import chord

from support.eventlog import read_events
from support.waiting import wait_for


def starts(events, pid: int | None = None) -> dict[str, float]:
    """Task key -> when it started (of one worker process when ``pid`` is given)."""
    return {
        e.words[0]: e.at
        for e in read_events(events)
        if e.kind == "start" and (pid is None or e.pid == pid)
    }


GREEN = ["gevent", "eventlet"]


@pytest.mark.parametrize("pool", GREEN)
def test_a_green_worker_runs_tasks_side_by_side(app, start_worker, events, pool):
    worker = start_worker("g", pool=pool, concurrency=8)
    keys = [f"k{i}" for i in range(8)]
    results = [app.send_task("record", (key, 1.0)) for key in keys]
    assert [r.get(timeout=60) for r in results] == keys
    log = read_events(events)
    began = [e.at for e in log if e.kind == "start"]
    ended = [e.at for e in log if e.kind == "done"]
    assert len(began) == 8 and max(began) < min(ended)  # all eight ran at once
    header = [app.signature("add", (i, i)) for i in range(10)]
    assert chord(header)(app.signature("tsum")).get(timeout=60) == 90
    replies = app.control.inspect(timeout=5).ping()
    assert replies is not None and any(name.startswith("g@") for name in replies)
    assert worker.stop() == 0  # a warm shutdown ends the process


@pytest.mark.parametrize("lease", [2.0])
@pytest.mark.parametrize("pool", GREEN)
def test_a_green_worker_renews_its_tasks_and_they_return_when_it_dies(
    app, start_worker, events, pool
):
    """Held beyond two leases while the worker lives; run again within 15 s once it is killed."""
    victim = start_worker("victim", pool=pool, concurrency=4)
    keys = [f"long{i}" for i in range(4)]
    for key in keys:
        app.send_task("record", (key, 60.0))
    wait_for(lambda: set(starts(events, victim.pid)) == set(keys), 30, "the victim to run all four")
    heir = start_worker("heir", pool="threads", concurrency=4)
    held_since = max(starts(events, victim.pid).values())
    # Two leases pass with an idle worker ready: renewals keep the tasks the victim's.
    wait_for(lambda: time.time() > held_since + 2 * 2.0 + 1.0, 30, "two leases", interval=0.2)
    assert starts(events, heir.pid) == {}
    victim.kill()
    killed = time.time()

    def all_rerun() -> dict[str, float] | None:
        got = starts(events, heir.pid)
        return got if set(got) == set(keys) else None

    rerun = wait_for(all_rerun, 30, "the heir to run the dead worker's four tasks")
    assert max(rerun.values()) - killed < 15
