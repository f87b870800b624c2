"""Canvas cases Celery's own integration suite found different from its Redis backend.

Each test pins one difference that ``make peer-tests`` (Celery's
``t/integration/`` on Celery's Redis transport and on ours, see
docs/celery.md) showed, on a real worker: a solo worker runs one task at a
time, so a chord body dispatched before its header finished would wait
forever for a header task queued behind it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import chain, chord, group
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult

from support.eventlog import read_events
from support.waiting import wait_for


def si(app: Any, name: str, *args: Any) -> Any:
    """An immutable signature (its parent's result is not passed)."""
    return app.signature(name, args, immutable=True)


def test_a_group_at_the_tail_of_a_chain_in_a_chord_header_counts_each_of_its_tasks(
    app, start_worker
):
    """Celery's ``set_chord_size`` counts the tail group's tasks: the body waits for all three."""
    start_worker("w1")
    tail = group(si(app, "add", 1, 1000), si(app, "add", 1, 2000))
    header = [si(app, "add", 1, 100), chain(si(app, "add", 1, 200), tail)]
    # The header's results keep their shape: the chained group's results are one entry.
    assert chord(header)(app.signature("identity")).get(timeout=20) == [101, [1001, 2001]]
    nested = chain(si(app, "add", 1, 0), group(*header), si(app, "add", 1, 10))
    assert nested().get(timeout=20) == 11


def test_a_failed_header_task_fails_the_chord_with_its_own_exception(app, start_worker):
    """``get()`` raises the header's exception, for a task body and a group body alike."""
    start_worker("w1")
    failing = [si(app, "add", 1, 1), si(app, "boom")]
    with pytest.raises(ValueError, match="boom"):
        chord(failing)(app.signature("identity")).get(timeout=20)
    in_chain = [chain(si(app, "add", 1, 1), si(app, "boom"), si(app, "add", 2, 2))]
    with pytest.raises(ValueError, match="boom"):
        chord(in_chain)(app.signature("identity")).get(timeout=20)
    body = group(app.signature("identity"), app.signature("identity"))
    result = chord(failing)(body)
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=20)
    # Each task of the group body failed with the header's exception, not a ChordError.
    for child in result.results:
        failed = AsyncResult(child.id, app=app)
        wait_for(lambda: failed.ready(), 20, "the group body's tasks to fail")  # noqa: B023
        assert isinstance(failed.result, ValueError)


def test_a_generator_header_is_sent_as_it_yields(app, start_worker, events):
    """The header's first task runs before the generator yields its last (Celery's #3021)."""
    start_worker("w1")

    def ran(key: str) -> bool:
        return any(e.kind == "done" and e.words[0] == key for e in read_events(events))

    def header() -> Iterator[Any]:
        for i in range(3):
            if i == 2:
                wait_for(lambda: ran("k0"), 20, "the first header task to run, mid-header")
            yield app.signature("record", (f"k{i}",))

    assert chord(header(), app.signature("collect")).apply_async().get(timeout=20) == [
        "k0",
        "k1",
        "k2",
    ]


def test_a_header_task_adds_tasks_to_its_own_chord(app, start_worker):
    """``Task.add_to_chord``: the body waits for the added tasks and gets their results."""
    start_worker("w1")
    header = [app.signature("add_to_own_chord", ([1, 2, 3],)), si(app, "add", 10, 0)]
    assert sorted(chord(header)(app.signature("identity")).get(timeout=20)) == [0, 2, 3, 4, 10]


def test_a_frozen_chord_applied_again_dispatches_its_body_again(app, start_worker, events):
    """A frozen chord reuses its group ID; each apply is a new run with a body of its own."""
    start_worker("w1")
    header = [app.signature("record", ("a",)), app.signature("record", ("b",))]
    frozen = chord(header, app.signature("collect"))
    frozen.freeze()

    def bodies() -> int:
        return len([e for e in read_events(events) if e.kind == "body"])

    for runs in (1, 2):
        assert frozen.apply_async().get(timeout=20) == ["a", "b"]
        wait_for(lambda: bodies() >= runs, 20, f"body run {runs}")  # noqa: B023
    time.sleep(0.5)  # a third body would come right after the second
    assert bodies() == 2


def test_remote_control_sent_before_a_task_is_handled_first(app, start_worker, events):
    """Remote control is drained before tasks, whatever the channels' rotation stands at.

    While the solo worker runs a task, two revokes and then the task the
    second revokes arrive; when the worker looks again all three wait.
    kombu's fair rotation would move on to the task channel after the first
    revoke and run the task; the pidbox channel goes first every time.
    """
    start_worker("w1")

    def started(key: str) -> bool:
        return any(e.kind == "start" and e.words[0] == key for e in read_events(events))

    for i in range(2):
        busy = app.send_task("record", (f"busy{i}", 0.5))
        wait_for(lambda: started(f"busy{i}"), 20, f"busy{i} to start")  # noqa: B023
        target = app.signature("record", (f"revoked{i}",))
        result = target.freeze()
        app.control.revoke(f"another-task-{i}")
        app.control.revoke(result.id)
        target.apply_async()
        assert busy.get(timeout=20) == f"busy{i}"
        with pytest.raises(TaskRevokedError):
            result.get(timeout=20)
    assert not [e for e in read_events(events) if e.words and e.words[0].startswith("revoked")]
