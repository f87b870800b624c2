"""The namespace snapshot (depths.lua) and the Prometheus exporter, on a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.leases import Leases
from simplebroker_redis.ops.cli import find_target
from simplebroker_redis.ops.observe import read_namespace
from simplebroker_redis.server import URL_ENV, TargetError


def fill(core: RedisBrokerCore, runner: RedisRunner) -> None:
    """jobs: 2 pending, 1 delayed, 2 reserved, 1 claimed; jobs.dead: 1; mail: 1."""
    for i in range(6):
        core.write("jobs", f"job {i}")
    core.claim_one("jobs")  # the oldest: claimed
    Leases(runner).reserve("jobs", 2, lease_seconds=60, max_deliveries=3, dead_letter="held.dlq")
    core.write_delayed("jobs", "later", 600)
    core.write("jobs.dead", "died")
    core.write("mail", "hello")


def test_snapshot_counts_every_state(broker: RedisBrokerCore, runner: RedisRunner) -> None:
    before = time.time()
    fill(broker, runner)
    state = read_namespace(runner)
    assert state.round_trips == 1
    by_name = {q.queue: q for q in state.queues}
    assert sorted(by_name) == ["jobs", "jobs.dead", "mail"]
    jobs = by_name["jobs"]
    assert (jobs.pending, jobs.reserved, jobs.delayed, jobs.claimed) == (3, 2, 1, 1)
    assert jobs.oldest_pending_us is not None
    assert before * 1e6 - 1e6 <= jobs.oldest_pending_us <= state.now_us
    # Dead-letter queues: by the .dead suffix, and the live reservation's target.
    assert state.dead_letter_queues == {"jobs.dead", "held.dlq"}
    assert by_name["mail"].reserved == 0


def test_pages_read_the_same_as_one_call(broker: RedisBrokerCore, runner: RedisRunner) -> None:
    for i in range(25):
        for _ in range(i % 3 + 1):
            broker.write(f"q{i:02d}", "x")
    whole = read_namespace(runner)
    paged = read_namespace(runner, page_size=7)
    assert whole.queues == paged.queues
    assert (whole.round_trips, paged.round_trips) == (1, 4)
    assert [q.pending for q in whole.queues] == [i % 3 + 1 for i in range(25)]


def test_dense_and_sparse_sets_count_alike(broker: RedisBrokerCore, runner: RedisRunner) -> None:
    # 3 queues with 30 messages each: pending is dense (counted per queue),
    # reserved sparse (walked member by member).
    for name in ("a", "b", "c"):
        for i in range(30):
            broker.write(name, str(i))
    Leases(runner).reserve("b", 4, lease_seconds=60)
    state = read_namespace(runner)
    assert [(q.queue, q.pending, q.reserved) for q in state.queues] == [
        ("a", 30, 0),
        ("b", 26, 4),
        ("c", 30, 0),
    ]


def test_find_target_reads_the_project_config(
    tmp_path: Path, server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    url = server.url  # type: ignore[attr-defined]
    (tmp_path / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{url}"\n\n'
        '[backend_options]\nnamespace = "proj"\n'
    )
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    found = find_target(directory=nested)
    assert (found.target, found.options["namespace"]) == (url, "proj")
    assert found.source.endswith(".broker.toml")
    assert find_target(directory=nested, namespace="other").options["namespace"] == "other"
    # The workers' rule: $SIMPLEBROKER_REDIS_URL comes before the project file.
    monkeypatch.setenv(URL_ENV, "redis://127.0.0.1:7009/0")
    found = find_target(directory=nested)
    assert (found.target, found.source) == ("redis://127.0.0.1:7009/0", f"${URL_ENV}")
    assert find_target(url, directory=nested).source == "--target"


def test_find_target_without_any_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BROKER_BACKEND", raising=False)
    monkeypatch.delenv("BROKER_BACKEND_TARGET", raising=False)
    monkeypatch.delenv(URL_ENV, raising=False)
    with pytest.raises(TargetError, match="--target"):
        find_target(directory=tmp_path)


@pytest.fixture
def exporter(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The exporter as a process, found through a .broker.toml (no --target)."""
    (tmp_path / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{redis_url}"\n\n'
        f'[backend_options]\nnamespace = "{namespace}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "simplebroker_redis.metrics", "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != URL_ENV}, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving metrics of" in line, line
        yield line.rsplit(" ", 1)[1].strip(), tmp_path
    finally:
        proc.terminate()
        proc.wait(10)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "namespace"))
            out[(sample.name, labels)] = sample.value
    return out


def test_exporter_serves_depths_and_follows_them(
    exporter: tuple[str, Path], broker: RedisBrokerCore, runner: RedisRunner
) -> None:
    url, _ = exporter
    fill(broker, runner)
    got = scrape(url)
    assert got[("simplebroker_up", ())] == 1

    def state(queue: str, name: str) -> float:
        return got[("simplebroker_queue_messages", (("queue", queue), ("state", name)))]

    assert [state("jobs", name) for name in ("pending", "reserved", "claimed")] == [3, 2, 1]
    assert got[("simplebroker_dead_letter_messages", (("queue", "jobs.dead"),))] == 1
    assert got[("simplebroker_dead_letter_messages", (("queue", "held.dlq"),))] == 0
    assert got[("simplebroker_queues", ())] == 3
    assert got[("simplebroker_scrape_round_trips", ())] == 1
    age = got[("simplebroker_queue_oldest_pending_age_seconds", (("queue", "jobs"),))]
    assert 0 <= age < 60
    broker.write("mail", "again")
    again = scrape(url)
    assert again[("simplebroker_queue_messages", (("queue", "mail"), ("state", "pending")))] == 2


def test_exporter_refuses_without_a_target(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_") and k != URL_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "simplebroker_redis.metrics", "--port", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no server named" in done.stderr


def test_task_names_are_exported_with_bounded_labels(runner: RedisRunner) -> None:
    """Counts, the execution-time histogram and recent percentiles, per task name."""
    from prometheus_client import CollectorRegistry, generate_latest

    from simplebroker_redis.ops.metrics import NamespaceCollector
    from simplebroker_redis.tasks import TaskStats

    stats = TaskStats(runner, interval=3600)
    for name, runs in (("busy", 30), ("steady", 10), ("rare", 2), ("rarer", 1)):
        stats.enqueued(name, runs)
        for i in range(runs):
            stats.finished(name, 0.02 if i else 3.0, ok=i % 10 != 9)
    stats.flush()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NamespaceCollector(runner, max_task_names=2))
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "namespace"))
            got[(sample.name, labels)] = sample.value

    tasks = {labels for name, labels in got if name == "simplebroker_tasks_total"}
    assert {dict(labels)["task"] for labels in tasks} == {"busy", "steady", "other"}
    total = "simplebroker_tasks_total"
    assert got[(total, (("event", "enqueued"), ("task", "busy")))] == 30
    assert got[(total, (("event", "failed"), ("task", "busy")))] == 3
    assert got[(total, (("event", "enqueued"), ("task", "other")))] == 3  # rare + rarer
    hist = "simplebroker_task_duration_seconds"
    assert got[(hist + "_count", (("task", "busy"),))] == 30
    assert got[(hist + "_bucket", (("le", "0.025"), ("task", "busy")))] == 29
    assert got[(hist + "_bucket", (("le", "2.5"), ("task", "busy")))] == 29
    assert got[(hist + "_bucket", (("le", "5.0"), ("task", "busy")))] == 30
    assert 3.5 < got[(hist + "_sum", (("task", "busy"),))] < 3.7
    p99 = got[
        ("simplebroker_task_duration_recent_seconds", (("quantile", "0.99"), ("task", "busy")))
    ]
    assert 3.0 <= p99 <= 3.0 * 2 ** (1 / 4)
    assert got[("simplebroker_task_names", ())] == 4


def test_the_grafana_dashboard_queries_only_what_the_exporter_serves(runner: RedisRunner) -> None:
    """docs/grafana-dashboard.json: every metric its queries name is one the exporter serves."""
    import json
    import re

    from prometheus_client import CollectorRegistry, generate_latest

    from simplebroker_redis.ops.metrics import NamespaceCollector
    from simplebroker_redis.tasks import TaskStats

    stats = TaskStats(runner, interval=3600)
    stats.enqueued("t")
    stats.finished("t", 0.1, ok=True)
    stats.flush()
    core = RedisBrokerCore(runner)
    try:
        fill(core, runner)
    finally:
        core.close()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NamespaceCollector(runner))
    served = {
        sample.name
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    board = json.loads((Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", ())]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    named = {name for expr in exprs for name in re.findall(r"\bsimplebroker_\w+", expr)}
    assert named and named <= served, named - served
