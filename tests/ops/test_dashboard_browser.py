"""The dashboard in headless Chromium, against a real server and real workers.

A Taskiq worker and a Celery worker run opsapps.py on one namespace, a
Dramatiq worker opsdramatiq.py, and Protean's engine runs opsprotean.py;
the page must show their tasks while they run (with the worker holding
each), find each task by its id and follow it from running to done, list
dead letters with their task names and errors and retry one until it is
done, draw a burst in the task charts without a reload, and offer no
action when read-only. The same workers serve the tests of their
Prometheus metrics and of the trace that runs from the producer through
the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opshelpers import OPS_DIR, TOKEN, Ops, start_dashboard, worker_record
from prometheus_client.parser import text_string_to_metric_families
from taskiq.kicker import AsyncKicker

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.queue_names import storage_queue
from support.eventlog import read_events
from support.waiting import wait_for
from taskiq_simplebroker import SimpleBrokerTaskiqBroker
from taskiq_simplebroker.tracing import TracingMiddleware

# A browser drives the page: the scripts behind it run on each server binary
# in the other tests of tests/ops.
pytestmark = pytest.mark.once

#: Where screenshots go when asked for (``OPS_SCREENSHOTS=docs``), to update the docs.
SHOTS = os.environ.get("OPS_SCREENSHOTS")


def memory_tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def kick_taskiq(ops: Ops, task: str, *args: Any, provider: Any = None) -> str:
    """Send a task to the Taskiq worker; return its task id."""

    async def send() -> str:
        broker = SimpleBrokerTaskiqBroker(url=ops.url, namespace=ops.namespace, queue="taskiq")
        if provider is not None:
            broker = broker.with_middlewares(TracingMiddleware(tracer_provider=provider))
        await broker.startup()
        try:
            sent = await AsyncKicker(task_name=task, broker=broker, labels={}).kiq(*args)
            return str(sent.task_id)
        finally:
            await broker.shutdown()

    # Playwright's sync API runs an event loop on this thread: send from another.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, send()).result(60)


def celery_app(ops: Ops) -> Any:
    from celery import Celery

    import celery_simplebroker  # noqa: F401 - registers the transport

    app = Celery("ops-producer")
    app.conf.update(
        broker_url=f"simplebroker+{ops.url}",
        broker_transport_options={"namespace": ops.namespace},
        broker_connection_retry_on_startup=True,
    )
    return app


def logged(ops: Ops, *kinds: str, words: tuple[str, ...] | None = None) -> bool:
    """Return whether the workers logged an event of every kind (with ``words``, if given)."""
    return all(
        any(words in (None, event.words) for event in read_events(ops.log, kind)) for kind in kinds
    )


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def cell(page: Any, table: str, queue: str, column: str) -> str:
    return str(page.text_content(f"#{table} tr[data-queue='{queue}'] td.{column}") or "")


def shot(page: Any, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"dashboard-{name}.png"), full_page=True)


@pytest.fixture
def page(browser: Any, dashboard: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(f"{dashboard}/?token={TOKEN}")  # logs in, then shows the page
    tab.wait_for_selector("#live.on")
    tab.evaluate("window.loadedOnce = true")  # gone if the page were reloaded
    yield tab
    assert tab.evaluate("window.loadedOnce") is True, "the page was reloaded"
    context.close()
    assert not errors, errors


def test_the_page_shows_running_taskiq_and_celery_tasks_with_their_workers(
    ops: Ops, taskiq_worker: dict[str, Any], celery_worker: dict[str, Any], page: Any
) -> None:
    kick_taskiq(ops, "ops.slow", "tq-1")
    app = celery_app(ops)
    try:
        app.send_task("ops.celery_slow", ("ce-1",), queue="celery")
    finally:
        app.close()
    # Both are in flight: the page shows them reserved, without a reload.
    page.wait_for_function(
        """() => ['taskiq', 'celery'].every((q) => {
             const td = document.querySelector(`#queues tr[data-queue='${q}'] td.reserved`);
             return td && td.textContent === '1'; })""",
        timeout=30_000,
    )
    wait_for(lambda: logged(ops, "taskiq-start", "celery-start"), 30, "starts")
    # While they run: each framework's worker counts its running task.
    running = scrape(taskiq_worker["metrics_port"])
    assert running[("simplebroker_running_tasks", (("task_name", "ops.slow"),))] == 1
    assert scrape(celery_worker["metrics_port"])[("simplebroker_running_tasks", ())] == 1
    # The workers' heartbeats: both kinds are listed, and hold what they run.
    page.wait_for_selector(f"#workers tr[data-worker='{taskiq_worker['id']}']")
    page.wait_for_selector(f"#workers tr[data-worker='{celery_worker['id']}']")
    assert (
        page.text_content(f"#workers tr[data-worker='{taskiq_worker['id']}'] td.kind") == "taskiq"
    )
    shot(page, "overview")
    page.click("#queues tr[data-queue='taskiq']")
    holder = page.wait_for_selector("#detail table.messages.reserved td.holder")
    assert holder.text_content() == taskiq_worker["id"]
    shot(page, "queue")
    page.click("#queues tr[data-queue='celery']")
    page.wait_for_function(
        f"""() => {{ const td = document.querySelector('#detail table.messages.reserved td.holder');
                  return td && td.textContent === {json.dumps(celery_worker["id"])}; }}""",
        timeout=30_000,
    )
    # Both finish: the page follows, still without a reload.
    for tag in ("tq-1", "ce-1"):
        (ops.dir / f"release-{tag}").touch()
    wait_for(lambda: logged(ops, "taskiq-done", "celery-done"), 30, "ends")
    page.wait_for_function(
        """() => ['taskiq', 'celery'].every((q) => {
             const td = document.querySelector(`#queues tr[data-queue='${q}'] td.reserved`);
             return !td || td.textContent === '0'; })""",
        timeout=30_000,
    )
    renewals = scrape(taskiq_worker["metrics_port"])
    assert renewals[("simplebroker_lease_renewals_total", ())] >= 1  # it ran for beats of 0.3 s
    assert renewals[("simplebroker_running_tasks", (("task_name", "ops.slow"),))] == 0
    assert scrape(celery_worker["metrics_port"])[("simplebroker_lease_renewals_total", ())] >= 1


def test_new_messages_appear_live(ops: Ops, page: Any) -> None:
    runner = RedisRunner(ops.url, namespace=ops.namespace)
    core = RedisBrokerCore(runner)
    try:
        updates = int(page.evaluate("Number(document.body.dataset.updates || 0)"))
        core.write("live.check", "one")
        page.wait_for_selector("#queues tr[data-queue='live.check']", timeout=30_000)
        assert cell(page, "queues", "live.check", "pending") == "1"
        core.write("live.check", "two")
        page.wait_for_function(
            """() => document.querySelector("#queues tr[data-queue='live.check'] td.pending")
                       .textContent === '2'""",
            timeout=30_000,
        )
        assert int(page.evaluate("Number(document.body.dataset.updates)")) > updates
        core.delete("live.check")
    finally:
        core.close()
        runner.shutdown()


def test_a_dead_lettered_task_is_requeued_from_the_page_and_runs(
    ops: Ops, taskiq_worker: dict[str, Any], page: Any
) -> None:
    kick_taskiq(ops, "ops.flaky", "poison-1")
    wait_for(lambda: logged(ops, "taskiq-reject"), 30, "the task's rejection")
    page.wait_for_selector("#dead tr[data-queue='taskiq.dead']", timeout=30_000)
    assert cell(page, "dead", "taskiq.dead", "count") == "1"
    page.click("#dead tr[data-queue='taskiq.dead'] button.link")
    row = page.wait_for_selector("#detail table.messages.pending tbody tr")
    assert row.query_selector("td.deliveries").text_content() == "1"
    assert "rejected" in (row.query_selector("td.reason").text_content() or "")
    assert page.input_value("#detail-actions input.target") == "taskiq"
    shot(page, "dead-letters")
    ops.marker.write_text("run now")  # the task succeeds from now on
    # A cancelled confirmation changes nothing.
    page.click("#detail button.requeue-one")
    page.wait_for_selector("#modal:not([hidden])")
    page.click("#modal-cancel")
    assert cell(page, "dead", "taskiq.dead", "count") == "1"
    page.click("#detail button.requeue-one")
    page.click("#modal-ok")
    assert "requeued 1 message" in page.wait_for_selector("#toast:not([hidden])").text_content()
    wait_for(lambda: logged(ops, "taskiq-ran"), 30, "the requeued task's run")
    assert read_events(ops.log, "taskiq-ran")[0].words == ("poison-1",)
    page.wait_for_selector("#dead tr[data-queue='taskiq.dead']", state="detached", timeout=30_000)


def test_purge_asks_first_then_deletes_every_dead_letter(ops: Ops, page: Any) -> None:
    runner = RedisRunner(ops.url, namespace=ops.namespace)
    core = RedisBrokerCore(runner)
    try:
        for body in ("a", "b", "c"):
            core.write("billing.dead", body)
        page.wait_for_selector("#dead tr[data-queue='billing.dead']", timeout=30_000)
        page.click("#dead tr[data-queue='billing.dead'] button.purge")
        page.click("#modal-cancel")
        assert len(core.peek_many("billing.dead", 10, with_timestamps=False)) == 3
        page.click("#dead tr[data-queue='billing.dead'] button.purge")
        page.click("#modal-ok")
        page.wait_for_selector("#dead tr[data-queue='billing.dead']", state="detached")
        assert core.peek_many("billing.dead", 10, with_timestamps=False) == []
    finally:
        core.close()
        runner.shutdown()


def test_one_trace_runs_from_the_producer_through_each_worker(
    ops: Ops, taskiq_worker: dict[str, Any], celery_worker: dict[str, Any]
) -> None:
    from celery_simplebroker import tracing

    provider, exporter = memory_tracing()
    for tag in ("traced-tq", "traced-ce"):
        (ops.dir / f"release-{tag}").touch()
    kick_taskiq(ops, "ops.slow", "traced-tq", provider=provider)
    app = celery_app(ops)
    uninstall = tracing.install(app, tracer_provider=provider)
    try:
        app.send_task("ops.celery_slow", ("traced-ce",), queue="celery")
    finally:
        uninstall()
        app.close()
    sent = {span.name: span for span in exporter.get_finished_spans()}
    assert set(sent) == {"ops.slow send", "ops.celery_slow send"}

    def worker_spans() -> dict[str, dict[str, Any]]:
        if not ops.spans.exists():
            return {}
        lines = [json.loads(line) for line in ops.spans.read_text().splitlines()]
        return {s["name"]: s for s in lines if s["attributes"].get("messaging.message.id")}

    for name in ("ops.slow", "ops.celery_slow"):
        producer = sent[f"{name} send"]
        consumer = wait_for(
            lambda name=name, producer=producer: next(
                (
                    s
                    for s in worker_spans().values()
                    if s["name"] == f"{name} process"
                    and s["trace_id"] == f"{producer.context.trace_id:032x}"
                ),
                None,
            ),
            30,
            f"the worker's span of {name}",
        )
        assert consumer["kind"] == "CONSUMER"
        assert consumer["parent_id"] == f"{producer.context.span_id:016x}"
        assert producer.kind.name == "PRODUCER"


def test_a_celery_worker_sends_its_lease_counts_as_events(
    ops: Ops, celery_worker: dict[str, Any]
) -> None:
    """``worker -E``: a worker-simplebroker event follows each worker heartbeat."""
    import threading

    app = celery_app(ops)
    got: list[dict[str, Any]] = []
    try:
        app.send_task("ops.celery_slow", ("ev-1",), queue="celery")
        wait_for(lambda: logged(ops, "celery-start", words=("ev-1",)), 30, "the task's start")
        with app.connection_for_read() as conn:

            def on_event(event: dict[str, Any]) -> None:
                if event["running"] >= 1 and event["renewals"] >= 1:
                    got.append(event)
                    monitor.should_stop = True

            monitor = app.events.Receiver(conn, handlers={"worker-simplebroker": on_event})
            watchdog = threading.Timer(30, setattr, (monitor, "should_stop", True))
            watchdog.start()
            try:
                monitor.capture(limit=None, timeout=None, wakeup=False)
            finally:
                watchdog.cancel()
    finally:
        (ops.dir / "release-ev-1").touch()
        app.close()
    assert got, "no worker-simplebroker event saw the running task within 30 s"
    event = got[0]
    assert event["hostname"].startswith("ops-")
    assert {"renew_failures", "leases_lost", "recovered"} <= set(event)


def test_a_queue_stored_escaped_is_shown_by_the_frameworks_name(ops: Ops, page: Any) -> None:
    """Taskiq's ``taskiq:names`` is stored as ``taskiq-3Anames``: the page shows the first."""
    runner = RedisRunner(ops.url, namespace=ops.namespace)
    core = RedisBrokerCore(runner)
    stored = storage_queue("taskiq:names")
    try:
        core.write(stored, "one")
        row = f"#queues tr[data-queue='{stored}']"
        page.wait_for_selector(row, timeout=30_000)
        name = page.locator(f"{row} td.name")
        assert name.text_content() == "taskiq:names"
        assert name.get_attribute("title") == stored  # what broker peek and the actions take
        core.delete(stored)
    finally:
        core.close()
        runner.shutdown()


# -- tasks, not only queues (issue 44) -----------------------------------------------------
def publish_protean(ops: Ops, tag: str) -> tuple[str, str]:
    """Publish a Protean event from a process of its own; return (identifier, Protean's id)."""
    done = subprocess.run(
        [sys.executable, str(OPS_DIR / "opsprotean.py"), "publish", tag],
        env=ops.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    identifier, own = done.stdout.split()[-2:]
    return identifier, own


def find(page: Any, query: str) -> None:
    page.fill("#find-input", query)
    page.click("#find-form button")
    page.wait_for_function(
        f"() => document.querySelector('#found-query').textContent === {json.dumps(query)}"
    )


def found(page: Any, framework: str, state: str, timeout: float = 30_000) -> Any:
    return page.wait_for_selector(
        f"#found .task[data-framework='{framework}'][data-state='{state}']", timeout=timeout
    )


def text(node: Any, selector: str) -> str:
    return str(node.query_selector(selector).text_content())


def held_by(page: Any, framework: str, worker: str) -> Any:
    """Wait until the found task of ``framework`` runs, held by ``worker``.

    The worker's record names what it holds at its next beat after the
    reservation, so the holder can show a beat after the running state.
    """
    selector = f"#found .task[data-framework='{framework}'][data-state='running'] dd.worker"
    page.wait_for_function(
        f"""() => {{ const dd = document.querySelector({json.dumps(selector)});
                   return dd && dd.textContent === {json.dumps(worker)}; }}""",
        timeout=30_000,
    )
    return found(page, framework, "running")


def test_each_frameworks_task_is_found_by_id_running_then_done(
    ops: Ops,
    taskiq_worker: dict[str, Any],
    celery_worker: dict[str, Any],
    protean_worker: Any,
    page: Any,
) -> None:
    """Taskiq, Celery and Protean: found by their ids, running (worker, since) then done."""
    task_id = kick_taskiq(ops, "ops.slow", "find-tq")
    find(page, task_id)
    card = held_by(page, "taskiq", taskiq_worker["id"])
    assert text(card, "strong.name") == "ops.slow"
    assert text(card, "dd.deliveries") == "1"
    shot(page, "task-running")
    (ops.dir / "release-find-tq").touch()
    card = found(page, "taskiq", "done")
    assert text(card, "dd.result").startswith("SUCCESS")

    app = celery_app(ops)
    try:
        celery_id = app.send_task("ops.celery_slow", ("find-ce",), queue="celery").id
    finally:
        app.close()
    find(page, celery_id)
    card = held_by(page, "celery", celery_worker["id"])
    assert text(card, "strong.name") == "ops.celery_slow"
    (ops.dir / "release-find-ce").touch()
    card = found(page, "celery", "done")
    assert text(card, "dd.result") == "SUCCESS: find-ce"

    identifier, own_id = publish_protean(ops, "find-pr")
    wait_for(lambda: logged(ops, "protean-start", words=("find-pr",)), 60, "the handler's start")
    protean = wait_for(lambda: worker_record(ops.url, ops.namespace, "protean"), 30, "its record")
    find(page, identifier)
    card = held_by(page, "protean", protean["id"])
    assert text(card, "strong.name").endswith("ReportRequested.v1")
    page.wait_for_selector("#found .task[data-framework='protean'][data-state='published']")
    (ops.dir / "release-find-pr").touch()
    found(page, "protean", "done")
    shot(page, "task-done")
    # Protean's own id of the message finds the same message and its group's copy.
    find(page, own_id)
    found(page, "protean", "done")


def send_dramatiq(ops: Ops, actor: str, tag: str) -> str:
    """Send a message to the Dramatiq worker's actor ``actor``; return its message id."""
    from dramatiq import Message

    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker

    broker = SimpleBrokerDramatiqBroker(ops.url, namespace=ops.namespace)
    try:
        message: Message[Any] = Message(
            queue_name="dramatiq", actor_name=actor, args=(tag,), kwargs={}, options={}
        )
        return str(broker.enqueue(message).message_id)
    finally:
        broker.close()


def test_a_dramatiq_task_is_found_by_its_message_id_running_then_done(
    ops: Ops, dramatiq_worker: dict[str, Any], page: Any
) -> None:
    message_id = send_dramatiq(ops, "ops.dq_slow", "find-dq")
    find(page, message_id)
    card = held_by(page, "dramatiq", dramatiq_worker["id"])
    assert text(card, "strong.name") == "ops.dq_slow"
    assert text(card, "dd.deliveries") == "1"
    wait_for(lambda: logged(ops, "dramatiq-start", words=("find-dq",)), 30, "the actor's start")
    (ops.dir / "release-find-dq").touch()
    # Its message is gone: the result stored with the acknowledgement says done.
    card = found(page, "dramatiq", "done")
    assert text(card, "dd.result") == "SUCCESS: find-dq"


def test_a_failed_dramatiq_task_is_dead_lettered_then_retried_from_the_page_until_done(
    ops: Ops, dramatiq_worker: dict[str, Any], page: Any
) -> None:
    message_id = send_dramatiq(ops, "ops.dq_flaky", "poison-dq")
    row = page.wait_for_selector(f"#dead-tasks tr[data-task='{message_id}']", timeout=30_000)
    assert text(row, "td.name") == "ops.dq_flaky"
    assert text(row, "td.framework") == "dramatiq"
    # The exception Dramatiq's Results middleware stored after the nack is its error.
    error = f"#dead-tasks tr[data-task='{message_id}'] td.error"
    page.wait_for_function(
        f"""() => {{ const td = document.querySelector({json.dumps(error)});
                   return td && td.textContent.includes('ValueError: poison-dq'); }}""",
        timeout=30_000,
    )
    find(page, message_id)
    card = found(page, "dramatiq", "dead")
    assert "dramatiq.XQ" in text(card, "dd.queue")
    assert text(card, "dd.error").startswith("ValueError")
    # Its dead-letter queue is listed too (the next live reading, at most 2 s on).
    page.wait_for_selector("#dead tr[data-queue='dramatiq.XQ']", timeout=30_000)
    assert cell(page, "dead", "dramatiq.XQ", "count") == "1"
    assert page.input_value("#dead tr[data-queue='dramatiq.XQ'] input.target") == "dramatiq"
    shot(page, "dramatiq-dead-letter")
    (ops.dir / "release-poison-dq").touch()  # it succeeds from now on
    page.click(f"#dead-tasks tr[data-task='{message_id}'] button.retry-one")
    page.wait_for_selector("#modal:not([hidden])")
    page.click("#modal-ok")
    # Back in its own queue: the worker runs it, and the page follows it to done.
    card = found(page, "dramatiq", "done")
    assert text(card, "dd.result") == "SUCCESS: poison-dq"
    assert logged(ops, "dramatiq-ran", words=("poison-dq",))
    page.wait_for_selector(f"#dead-tasks tr[data-task='{message_id}']", state="detached")


def test_a_dead_letter_shows_its_task_and_error_and_is_retried_until_done(
    ops: Ops, taskiq_worker: dict[str, Any], page: Any
) -> None:
    ops.marker.unlink(missing_ok=True)  # the flaky task rejects itself again
    task_id = kick_taskiq(ops, "ops.flaky", "poison-2")
    row = page.wait_for_selector(f"#dead-tasks tr[data-task='{task_id}']", timeout=30_000)
    assert text(row, "td.name") == "ops.flaky"
    assert text(row, "td.framework") == "taskiq"
    assert "rejected" in text(row, "td.error").lower()
    find(page, task_id)
    card = found(page, "taskiq", "dead")
    assert "taskiq.dead" in text(card, "dd.queue")
    shot(page, "dead-letters")
    ops.marker.write_text("run now")
    page.click(f"#dead-tasks tr[data-task='{task_id}'] button.retry-one")
    page.wait_for_selector("#modal:not([hidden])")
    page.click("#modal-ok")
    # Retried in its own queue: it runs, and the page follows it to done.
    card = found(page, "taskiq", "done")
    assert text(card, "dd.result").startswith("SUCCESS")
    page.wait_for_selector(f"#dead-tasks tr[data-task='{task_id}']", state="detached")


def test_the_task_charts_draw_a_burst_without_a_reload(
    ops: Ops, taskiq_worker: dict[str, Any], page: Any
) -> None:
    async def burst() -> None:
        broker = SimpleBrokerTaskiqBroker(url=ops.url, namespace=ops.namespace, queue="taskiq")
        await broker.startup()
        try:
            kicker = AsyncKicker(task_name="ops.quick", broker=broker, labels={})
            await asyncio.gather(*(kicker.kiq(n) for n in range(60)))
        finally:
            await broker.shutdown()

    before = page.evaluate("Number(document.querySelector('#chart-tasks').dataset.total || 0)")
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, burst()).result(60)
    page.wait_for_function(
        """() => { const td = document.querySelector("#names tr[data-name='ops.quick'] td.done");
                   return td && Number(td.textContent) >= 60; }""",
        timeout=60_000,
    )
    row = page.query_selector("#names tr[data-name='ops.quick']")
    assert int(text(row, "td.enqueued")) >= 60
    assert text(row, "td.p95") != "–"
    # The chart of tasks per minute drew them: 60 more enqueued, 60 more done.
    page.wait_for_function(
        f"() => Number(document.querySelector('#chart-tasks').dataset.total) >= {before} + 120"
    )
    page.click("#names tr[data-name='ops.quick']")  # the charts of one task name
    page.wait_for_function(
        "() => document.querySelector('#tasks-of').textContent === 'of ops.quick'"
    )
    page.wait_for_function(
        "() => Number(document.querySelector('#chart-times').dataset.drawn || 0) > 0"
    )
    shot(page, "task-charts")


def test_a_read_only_page_offers_no_retry_and_no_login_no_action(
    ops: Ops, browser: Any, dashboard: str, taskiq_worker: dict[str, Any]
) -> None:
    base = start_dashboard(ops, "read-only-page")
    runner = RedisRunner(ops.url, namespace=ops.namespace)
    core = RedisBrokerCore(runner)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        core.write("ro-page.dead", "dead body")
        tab = context.new_page()
        tab.goto(base + "/")
        tab.wait_for_selector("#live.on")
        assert tab.text_content("#mode") == "read-only"
        tab.wait_for_selector("#dead tr[data-queue='ro-page.dead']", timeout=30_000)
        tab.wait_for_selector("#dead-tasks tr", timeout=30_000)
        assert tab.query_selector_all("button.retry-one, button.delete-one, button.purge") == []
        # The page's own request, sent anyway, is refused.
        status = tab.evaluate(
            """async () => (await fetch('api/dead-letters/ro-page.dead/requeue', {
                 method: 'POST', headers: {'content-type': 'application/json'},
                 body: JSON.stringify({target: 'ro-page'})})).status"""
        )
        assert status == 403
        # A browser that never logged in to the dashboard with actions is refused too.
        other = browser.new_context()
        try:
            stranger = other.new_page()
            stranger.goto(dashboard + "/static/app.css")  # same origin, no login
            status = stranger.evaluate(
                """async () => (await fetch('/api/dead-letters/ro-page.dead/purge', {
                     method: 'POST', headers: {'x-csrf-token': 'guessed'}})).status"""
            )
            assert status == 401
        finally:
            other.close()
        assert core.peek_many("ro-page.dead", 10, with_timestamps=False) == ["dead body"]
    finally:
        context.close()
        core.delete("ro-page.dead")
        core.close()
        runner.shutdown()
