"""Remote control, revoke, purge and shutdown, by a user limited to docs/celery.md's ACL line.

The line is applied exactly as the document prints it (namespace and
password substituted) on a private server whose Functions library an
administrator loaded; a real ``celery worker`` (mingle, gossip and events
on), a client and the ``celery purge`` command then run remote control,
results, canvas, retries, ETA, revoke, purge and a remote shutdown, plus
every transport and result-backend operation in-process
(``exercise_celery``). The server's ACL LOG must record no denial.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import chain, chord, group
from celery.result import AsyncResult

from faults.exercise import exercise_celery
from simplebroker_redis import RedisBrokerCore, RedisRunner
from simplebroker_redis.ops import functions
from support.eventlog import read_events
from support.waiting import wait_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "celery.md"


def celery_acl_rules() -> list[str]:
    """Return the rules of the document's ``ACL SETUSER myapp ...`` line."""
    found = [
        line.strip() for line in DOC.read_text().splitlines() if line.startswith("ACL SETUSER ")
    ]
    assert len(found) == 1, f"docs/celery.md should give exactly one ACL line, found {found}"
    words = found[0].split()
    assert words[2] == "myapp", found[0]
    return words[3:]


@pytest.fixture
def acl_server(make_server):
    return make_server("acl")


@pytest.fixture
def admin(acl_server):
    client = redis.Redis.from_url(acl_server.url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def celery_url(acl_server, admin, namespace: str) -> str:
    """The URL of a user limited by the document's line to this test's namespace."""
    password = "acl-" + uuid.uuid4().hex
    rules = [
        rule.replace("{myapp}", "{" + namespace + "}").replace(">PASSWORD", ">" + password)
        for rule in celery_acl_rules()
    ]
    admin.execute_command("ACL", "SETUSER", namespace, *rules)
    assert functions.main(["load", acl_server.url]) == 0  # the administrator's step
    admin.execute_command("ACL", "LOG", "RESET")
    return f"redis://{namespace}:{password}@127.0.0.1:{acl_server.port}/0"


def denials(admin: redis.Redis, user: str) -> list[dict[str, Any]]:
    out = []
    for entry in admin.execute_command("ACL", "LOG"):
        if not isinstance(entry, dict):  # RESP2: a flat list of names and values
            entry = dict(zip(entry[::2], entry[1::2], strict=True))
        fields = entry
        if fields.get("username") == user:
            out.append({k: fields.get(k) for k in ("reason", "object", "context", "count")})
    return out


def test_remote_control_revoke_purge_and_shutdown_under_the_documented_acl_line(
    app, start_worker, events, celery_url, admin, namespace, celery_env
):
    worker = start_worker("w1", fast=False)  # with mingle, gossip and events, as by default
    replies = app.control.inspect(timeout=5).ping()
    assert replies and any(name.startswith("w1@") for name in replies)
    assert app.send_task("add", (2, 3)).get(timeout=60) == 5
    assert chain(app.signature("add", (1, 2)), app.signature("mul", (10,)))().get(timeout=60) == 30
    assert group(app.signature("add", (i, i)) for i in range(3))().get(timeout=60) == [0, 2, 4]
    header = [app.signature("record", (f"k{i}",)) for i in range(3)]
    assert chord(header)(app.signature("collect")).get(timeout=60) == ["k0", "k1", "k2"]
    assert app.send_task("flaky", ("r", 1, 0.5)).get(timeout=60) == "r:1"
    # Revoke a task the worker holds until its ETA: it never runs.
    doomed = app.send_task("record", ("doomed",), countdown=2)
    wait_for(
        lambda: any(e.kind == "received" and e.words[0] == doomed.id for e in read_events(events)),
        30,
        "the worker to hold the ETA task",
    )
    app.control.revoke(doomed.id)
    assert app.send_task("record", ("after",), countdown=3).get(timeout=60) == "after"
    assert not any(e.kind == "start" and e.words[0] == "doomed" for e in read_events(events))
    assert doomed.state == "REVOKED"
    done = app.send_task("add", (1, 1))
    assert done.get(timeout=60) == 2
    done.forget()
    assert AsyncResult(done.id, app=app).state == "PENDING"
    # `celery purge` empties a queue nobody consumes.
    for i in range(5):
        app.send_task("add", (i, i), queue="idle")
    core = RedisBrokerCore(RedisRunner(celery_url, namespace=namespace), owns_runner=True)
    assert len(core.peek_many("idle", 10)) == 5
    purge = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "celeryapp", "purge", "-f", "-Q", "idle"],
        env=celery_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert purge.returncode == 0, purge.stderr
    assert "5 messages" in purge.stdout
    assert core.peek_many("idle", 10) == []
    core.shutdown()
    exercise_celery(celery_url, namespace)  # every transport and backend operation
    # Remote shutdown: the worker exits by itself.
    app.control.shutdown(destination=list(replies))
    worker.process.wait(60)
    assert worker.process.returncode == 0
    assert denials(admin, namespace) == [], "the server denied a command Celery sent"
