"""The dashboard's guards over plain HTTP: read-only mode, tokens, bind address, passwords."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from opshelpers import Ops, start_dashboard

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer, free_port
from support.waiting import wait_for


def request(url: str, *, method: str = "GET", body: Any = None, **headers: str) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:  # not listening yet
        return 0, ""


@pytest.fixture(scope="module")
def read_only(ops: Ops) -> str:
    return start_dashboard(ops, "read-only")


def test_a_read_only_dashboard_refuses_actions_and_changes_nothing(
    ops: Ops, read_only: str
) -> None:
    runner = RedisRunner(ops.url, namespace=ops.namespace)
    core = RedisBrokerCore(runner)
    try:
        core.write("ro.dead", "keep me")
        action = {"x-dashboard-action": "1", "content-type": "application/json"}
        status, text = request(
            read_only + "/api/dead-letters/ro.dead/purge", method="POST", **action
        )
        assert (status, "--allow-actions" in text) == (403, True)
        assert core.peek_many("ro.dead", 10, with_timestamps=False) == ["keep me"]
        status, text = request(read_only + "/api/state")
        state = json.loads(text)
        assert state["actions"] is False
        assert "ro.dead" in state["dead_letter_queues"]
    finally:
        core.delete("ro.dead")
        core.close()
        runner.shutdown()


def test_actions_need_the_dashboards_header_and_valid_input(ops: Ops, dashboard: str) -> None:
    url = dashboard + "/api/dead-letters/x.dead/requeue"
    status, _ = request(url, method="POST", body={"target": "x"})  # a form of another site
    assert status == 403
    action = {"x-dashboard-action": "1", "content-type": "application/json"}
    status, text = request(url, method="POST", body={"target": "x.dead"}, **action)
    assert status == 400 and "differ" in text
    status, text = request(url, method="POST", body={"target": "x", "ids": [1.5]}, **action)
    assert status == 400 and "not a message id" in text
    status, text = request(url, method="POST", body={"target": "bad name!"}, **action)
    assert status == 400


def test_a_token_guards_every_route_and_the_password_never_reaches_a_page(
    ops: Ops, tmp_path_factory: pytest.TempPathFactory
) -> None:
    secret = "pw-never-shown-42"
    server = DevServer(
        data_dir=str(tmp_path_factory.mktemp("pw")), extra_args=["--requirepass", secret]
    ).start()
    try:
        url = server.url.replace("redis://", f"redis://:{secret}@")
        port = free_port()
        args = [sys.executable, "-m", "simplebroker_redis.dashboard", "--target", url]
        args += ["--namespace", "pw", "--port", str(port), "--token", "tok-1"]
        process = ops.start("token", args)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: request(base + "/api/state")[0] == 401, 60, "the dashboard")
        assert request(base + "/")[0] == 401
        assert request(base + "/api/state", authorization="Bearer wrong")[0] == 401
        status, text = request(base + "/api/state", authorization="Bearer tok-1")
        assert status == 200 and json.loads(text)["namespace"] == "pw"
        pages = [text]
        for path in ("/static/app.js", "/static/index.html"):
            pages.append(request(base + path, authorization="Bearer tok-1")[1])
        assert all(secret not in page for page in pages)
        assert secret not in process.output()
    finally:
        server.stop()


def test_another_address_than_loopback_needs_a_token(ops: Ops) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "simplebroker_redis.dashboard",
            "--target",
            ops.url,
            "--bind",
            "0.0.0.0",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--token" in done.stderr
