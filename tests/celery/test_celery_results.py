"""The result backend in-process: a succeeded task keeps its result; results expire."""

from __future__ import annotations

import pytest
import redis
from celery import states
from celery.result import AsyncResult


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
    key = backend.runner.keys.celery_entry("celery-task-meta-t2")
    assert 0 < raw.pttl(key) <= 2000
    assert AsyncResult("t2", app=app).get(timeout=10) == 7
