"""The dashboard's guards over plain HTTP: read-only mode, logins, CSRF, bind address, prefix."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from opshelpers import TOKEN, Ops, start_dashboard

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer, free_port
from support.waiting import wait_for


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def request(
    url: str, *, method: str = "GET", body: Any = None, **headers: str
) -> tuple[int, str, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    headers = {k.replace("_", "-"): v for k, v in headers.items()}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=10) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)
    except OSError:  # not listening yet
        return 0, "", {}


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def csrf_of(base: str, **login: str) -> str:
    status, text, _ = request(base + "/api/session", **login)
    assert status == 200, text
    return str(json.loads(text)["csrf"])


@pytest.fixture(scope="module")
def read_only(ops: Ops) -> str:
    return start_dashboard(ops, "read-only")


@pytest.fixture
def core(ops: Ops) -> Any:
    runner = RedisRunner(ops.url, namespace=ops.namespace)
    broker = RedisBrokerCore(runner)
    yield broker
    broker.close()
    runner.shutdown()


def test_a_read_only_dashboard_refuses_every_action_and_changes_nothing(
    ops: Ops, read_only: str, core: RedisBrokerCore
) -> None:
    core.write("ro.dead", "keep me")
    for action, body in (
        ("purge", None),
        ("requeue", {"target": "ro"}),
        ("delete", {"ids": ["1"]}),
    ):
        status, text, _ = request(
            f"{read_only}/api/dead-letters/ro.dead/{action}", method="POST", body=body
        )
        assert (status, "--allow-actions" in text) == (403, True), (action, text)
    assert core.peek_many("ro.dead", 10, with_timestamps=False) == ["keep me"]
    state = json.loads(request(read_only + "/api/state")[1])
    assert state["actions"] is False and "ro.dead" in state["dead_letter_queues"]
    session = json.loads(request(read_only + "/api/session")[1])
    assert session["actions"] is False and "csrf" not in session
    core.delete("ro.dead")


def test_an_action_needs_the_login_and_the_pages_csrf_token(
    ops: Ops, dashboard: str, core: RedisBrokerCore
) -> None:
    core.write("x.dead", "poison")
    url = dashboard + "/api/dead-letters/x.dead/requeue"
    csrf = csrf_of(dashboard, **bearer())
    good = {"target": "x"}
    # Without the token: refused, whatever else it carries.
    status, _, _ = request(url, method="POST", body=good, x_csrf_token=csrf)
    assert status == 401
    status, _, _ = request(url, method="POST", body=good, **bearer("wrong"), x_csrf_token=csrf)
    assert status == 401
    # Logged in, but without the page's CSRF token (a form another site posts): refused.
    status, text, _ = request(url, method="POST", body=good, **bearer())
    assert status == 403 and "x-csrf-token" in text
    status, _, _ = request(url, method="POST", body=good, **bearer(), x_csrf_token="guess")
    assert status == 403
    # A browser request from another site: refused even with the token.
    status, text, _ = request(
        url, method="POST", body=good, **bearer(), x_csrf_token=csrf, origin="http://evil.test"
    )
    assert status == 403 and "another site" in text
    assert core.peek_many("x.dead", 10, with_timestamps=False) == ["poison"]
    # Bad input is refused before anything runs.
    ok = {**bearer(), "x_csrf_token": csrf}
    for body, word in (
        ({"target": "x.dead"}, "differ"),
        ({"target": "x", "ids": [1.5]}, "not a message id"),
        ({"target": "bad name!"}, ""),
    ):
        status, text, _ = request(url, method="POST", body=body, **ok)
        assert status == 400 and word in text, text
    # Everything right: the dead letter goes back to work.
    status, text, _ = request(url, method="POST", body=good, **ok)
    assert status == 200 and json.loads(text)["moved"] == 1
    assert core.peek_many("x", 10, with_timestamps=False) == ["poison"]
    core.delete("x")


def test_delete_removes_one_dead_letter(ops: Ops, dashboard: str, core: RedisBrokerCore) -> None:
    first = core.write("del.dead", "one")
    core.write("del.dead", "two")
    ok = {**bearer(), "x_csrf_token": csrf_of(dashboard, **bearer())}
    url = dashboard + "/api/dead-letters/del.dead/delete"
    status, text, _ = request(url, method="POST", body={"ids": [str(first)]}, **ok)
    assert status == 200 and json.loads(text)["deleted"] == 1
    assert core.peek_many("del.dead", 10, with_timestamps=False) == ["two"]
    status, _, _ = request(url, method="POST", body={"ids": []}, **ok)
    assert status == 400
    core.delete("del.dead")


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
        for path in ("/", "/api/session", "/api/events", "/api/tasks/running", "/api/tasks/dead"):
            assert request(base + path)[0] == 401, path
        assert request(base + "/api/tasks/find?id=x")[0] == 401
        assert request(base + "/api/state", authorization="Bearer wrong")[0] == 401
        status, text, _ = request(base + "/api/state", authorization="Bearer tok-1")
        assert status == 200 and json.loads(text)["namespace"] == "pw"
        # /?token=... logs a browser in: an HttpOnly, SameSite=Strict cookie.
        status, _, headers = request(base + "/?token=tok-1")
        cookie = headers.get("set-cookie", "")
        assert (
            status == 303 and "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        )
        assert request(base + "/?token=nope")[0] == 401
        pages = [text]
        for path in ("/static/app.js", "/static/tasks.js", "/static/index.html"):
            pages.append(request(base + path)[1])
        assert all(secret not in page for page in pages)
        assert secret not in process.output()
    finally:
        server.stop()


def test_basic_auth_asks_the_browser_for_a_login(ops: Ops) -> None:
    port = free_port()
    args = [sys.executable, "-m", "simplebroker_redis.dashboard", "--target", ops.url]
    args += ["--namespace", ops.namespace, "--port", str(port), "--allow-actions"]
    process = ops.start("basic", args, SIMPLEBROKER_DASHBOARD_BASIC_AUTH="admin:s3cret")
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: request(base + "/api/session")[0] == 401, 60, "the dashboard")
    status, _, headers = request(base + "/")
    assert status == 401 and headers.get("www-authenticate", "").startswith("Basic ")
    login = {"authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()}
    wrong = {"authorization": "Basic " + base64.b64encode(b"admin:nope").decode()}
    assert request(base + "/api/state", **wrong)[0] == 401
    assert request(base + "/", **login)[0] == 200
    url = base + "/api/dead-letters/b.dead/purge"
    # The browser sends basic auth by itself, so it alone never lets an action through.
    assert request(url, method="POST", **login)[0] == 403
    csrf = csrf_of(base, **login)
    status, text, _ = request(url, method="POST", **login, x_csrf_token=csrf)
    assert status == 200 and json.loads(text)["deleted"] == 0
    assert "s3cret" not in process.output()


def test_actions_without_a_login_get_a_token_made_for_them(ops: Ops) -> None:
    port = free_port()
    args = [sys.executable, "-m", "simplebroker_redis.dashboard", "--target", ops.url]
    args += ["--namespace", ops.namespace, "--port", str(port), "--allow-actions"]
    process = ops.start("made-token", args)
    line = wait_for(
        lambda: next((w for w in process.output().split() if "?token=" in w), None),
        60,
        "the login URL",
    )
    token = line.split("?token=", 1)[1]
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: request(base + "/api/state")[0] == 401, 60, "the dashboard")
    assert request(base + "/api/state", **bearer(token))[0] == 200


def test_behind_a_reverse_proxy_the_page_keeps_to_its_prefix(ops: Ops) -> None:
    """With --root-path the page's URLs are relative and the login lands under the prefix.

    The proxy strips the prefix (nginx: ``location /sb/ { proxy_pass http://127.0.0.1:8808/; }``),
    so requests arrive as the dashboard's own paths.
    """
    port = free_port()
    args = [sys.executable, "-m", "simplebroker_redis.dashboard", "--target", ops.url]
    args += ["--namespace", ops.namespace, "--port", str(port), "--token", "t-1"]
    args += ["--root-path", "/sb"]
    process = ops.start("prefix", args)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: request(base + "/api/state")[0] == 401, 60, "the dashboard")
    assert "/sb/" in process.output()
    status, _, headers = request(base + "/?token=t-1")
    assert status == 303 and headers["location"] == "/sb/"
    assert "path=/sb/" in headers.get("set-cookie", "").lower()
    status, page, _ = request(base + "/", **bearer("t-1"))
    assert status == 200
    assert 'href="static/app.css"' in page and 'src="static/tasks.js"' in page
    assert '"/' not in page.replace('"/"', "")  # no absolute path anywhere
    scripts = request(base + "/static/app.js")[1] + request(base + "/static/tasks.js")[1]
    assert 'fetch("/' not in scripts and "fetch(`/" not in scripts
    assert 'EventSource("/' not in scripts


def test_another_address_than_loopback_needs_a_login(ops: Ops) -> None:
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
    assert "--token" in done.stderr and "--basic-auth" in done.stderr


def test_every_dashboard_reads_the_same_task_statistics_from_the_server(
    ops: Ops, dashboard: str, read_only: str
) -> None:
    """Kept in the server: a dashboard started later (a restart) and another one agree."""
    from simplebroker_redis.tasks import TaskStats

    runner = RedisRunner(ops.url, namespace=ops.namespace)
    try:
        stats = TaskStats(runner, interval=3600)
        stats.enqueued("agree.task", 7)
        for seconds in (0.01, 0.02, 0.5):
            stats.finished("agree.task", seconds, ok=seconds < 0.1)
        stats.flush()
    finally:
        runner.shutdown()
    late = start_dashboard(ops, "late")  # started after the counts were sent
    readings = []
    for base, login in ((dashboard, bearer()), (read_only, {}), (late, {})):
        status, text, _ = request(base + "/api/tasks/stats?minutes=5", **login)
        assert status == 200, text
        [row] = [row for row in json.loads(text)["names"] if row["name"] == "agree.task"]
        readings.append(row)
    assert readings[0] == readings[1] == readings[2]
    row = readings[0]
    assert (row["enqueued"], row["done"], row["failed"], row["runs"]) == (7, 2, 1, 3)
    assert row["p50"] is not None and 0.02 <= row["p50"] <= 0.02 * 2 ** (1 / 4)
