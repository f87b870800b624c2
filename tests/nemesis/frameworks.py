"""The five workloads: SimpleBroker's ``Queue``, Taskiq, Celery, Protean and Dramatiq.

See :mod:`.workloads` for what a workload provides; :data:`WORKLOADS` names them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from support.eventlog import read_events
from support.processes import TESTS, Process

from .history import Result
from .workloads import (
    HERE,
    Command,
    LoopThread,
    Producer,
    Setup,
    Workload,
    base_env,
    output_says,
    witnessed,
)

# -- SimpleBroker's Queue -----------------------------------------------------------------


class QueueLoad(Workload):
    """``Queue.write`` and at-least-once batches of :mod:`.queue_worker`."""

    name = "queue"
    queues = ("work",)

    def command(self, setup: Setup, name: str, url: str) -> Command:
        env = base_env(setup, [HERE])
        env.update(
            NEMESIS_URL=url,
            NEMESIS_NS=setup.namespace,
            NEMESIS_LOG=str(setup.folder / f"{name}.log"),
            NEMESIS_LEASE=str(setup.lease),
            NEMESIS_TASK_SECONDS=str(setup.task_seconds),
            **setup.durability_env("NEMESIS_"),
        )
        args = [sys.executable, str(HERE / "queue_worker.py")]
        return Command(args, env, output_says("queue worker ready"))

    def producer(self, setup: Setup, url: str) -> Producer:
        return _QueueProducer(url, setup)


class _QueueProducer:
    def __init__(self, url: str, setup: Setup) -> None:
        from simplebroker import Queue

        from simplebroker_redis import RedisRunner

        self.runner = RedisRunner(url, namespace=setup.namespace, **setup.durability())
        self.queue = Queue("work", db_path=self.runner.broker_target, runner=self.runner)

    def send(self, key: str) -> str:
        return str(self.queue.write(key))

    def close(self) -> None:
        self.queue.close()
        self.runner.shutdown()


# -- Taskiq ---------------------------------------------------------------------------------


class TaskiqLoad(Workload):
    """``taskiq worker`` on tests/taskiq/workerapp.py (prefetch 4, two tasks at once)."""

    name = "taskiq"
    results = True
    queues = ("taskiq",)

    def command(self, setup: Setup, name: str, url: str) -> Command:
        env = base_env(setup, [TESTS / "taskiq"])
        env.update(
            SIMPLEBROKER_REDIS_URL=url,
            TQ_NAMESPACE=setup.namespace,
            TQ_LOG=str(setup.folder / f"{name}.log"),
            TQ_NAME=name,
            TQ_LEASE=str(setup.lease),
            TQ_HEARTBEAT=str(min(2.0, setup.lease / 4)),  # the broker's default
            TQ_PREFETCH="4",
            **setup.durability_env("TQ_"),
        )
        args = ["worker", "workerapp:broker", "--workers", "1", "--max-async-tasks", "2"]
        return Command(
            [sys.executable, "-m", "taskiq", *args], env, output_says("listening on taskiq")
        )

    def producer(self, setup: Setup, url: str) -> Producer:
        return _TaskiqProducer(url, setup)

    def read_results(self, setup: Setup, refs: dict[str, str]) -> dict[str, Result]:
        from taskiq_simplebroker import SimpleBrokerResultBackend

        loop = LoopThread()
        backend = SimpleBrokerResultBackend(setup.admin_url, namespace=setup.namespace)

        async def read(key: str, ref: str) -> Result:
            try:
                result = await backend.get_result(ref)
            except Exception as exc:  # noqa: BLE001 - a missing result is a finding
                return Result(f"MISSING:{type(exc).__name__}", None, right=False)
            pid, right = witnessed(result.return_value, key)
            return Result("FAILURE" if result.is_err else "SUCCESS", pid, right)

        async def read_all() -> dict[str, Result]:
            await backend.startup()
            try:
                return {key: await read(key, ref) for key, ref in refs.items()}
            finally:
                await backend.shutdown()

        try:
            return dict(loop.run(read_all()))
        finally:
            loop.close()


class _TaskiqProducer:
    def __init__(self, url: str, setup: Setup) -> None:
        from taskiq_simplebroker import SimpleBrokerTaskiqBroker

        self.seconds = setup.task_seconds
        self.loop = LoopThread()
        self.broker = SimpleBrokerTaskiqBroker(
            url, namespace=setup.namespace, queue="taskiq", **setup.durability()
        )
        self.loop.run(self.broker.startup())

    def send(self, key: str) -> str:
        from taskiq.kicker import AsyncKicker

        kicker: AsyncKicker[Any, Any] = AsyncKicker("workerapp:witness", self.broker, {})
        task = self.loop.run(kicker.kiq(key, self.seconds))
        return str(task.task_id)

    def close(self) -> None:
        try:
            self.loop.run(self.broker.shutdown())
        finally:
            self.loop.close()


# -- Celery ---------------------------------------------------------------------------------


class CeleryLoad(Workload):
    """``celery worker -P prefork -c 2`` on tests/celery/celeryapp.py, acks late, results."""

    name = "celery"
    results = True
    queues = ("celery",)
    #: Options that make a worker start fast (as tests/celery/conftest.py's FAST).
    FAST = ("--without-mingle", "--without-gossip", "--without-heartbeat")

    def command(self, setup: Setup, name: str, url: str) -> Command:
        log = setup.folder / f"{name}.log"
        env = base_env(setup, [TESTS / "celery"])
        env.update(
            SIMPLEBROKER_REDIS_URL=url,
            CELERY_NS=setup.namespace,
            CELERY_LOG=str(log),
            CELERY_LEASE=str(setup.lease),
            CELERY_ACKS_LATE="1",
            **setup.durability_env("CELERY_"),
        )
        args = ["worker", "-P", "prefork", "-c", "2", "-n", f"{name}@%h", "-Q", "celery"]
        command = [sys.executable, "-m", "celery", "-A", "celeryapp", *args, *self.FAST]

        def ready(process: Process) -> bool:
            return any(e.pid == process.pid for e in read_events(log, "ready"))

        return Command([*command, "--loglevel", "INFO"], env, ready)

    def producer(self, setup: Setup, url: str) -> Producer:
        return _CeleryProducer(url, setup)

    def read_results(self, setup: Setup, refs: dict[str, str]) -> dict[str, Result]:
        app = _celery_app(setup.admin_url, setup)
        out = {}
        try:
            for key, ref in refs.items():
                outcome = app.AsyncResult(ref)
                pid, right = witnessed(outcome.result, key)
                out[key] = Result(outcome.state, pid, right)
        finally:
            app.close()
        return out


def _celery_app(url: str, setup: Setup) -> Any:
    sys.path.insert(0, str(TESTS / "celery"))
    from celeryapp import make_app

    return make_app(url, setup.namespace, os.devnull, setup.lease, True, setup.durability())


class _CeleryProducer:
    def __init__(self, url: str, setup: Setup) -> None:
        self.seconds = setup.task_seconds
        self.app = _celery_app(url, setup)

    def send(self, key: str) -> str:
        return str(self.app.send_task("witness", (key, self.seconds)).id)

    def close(self) -> None:
        self.app.close()


# -- Protean --------------------------------------------------------------------------------


class ProteanLoad(Workload):
    """Protean's engine on tests/protean/papp.py: two consumer groups (mailer, ledger)."""

    name = "protean"
    fanout = ("mailer", "ledger")

    def command(self, setup: Setup, name: str, url: str) -> Command:
        protean = TESTS / "protean"
        src = TESTS.parent / "src"
        env = base_env(setup, [protean, src, src / "integrations"])
        env.update(
            PBK_URI=url,
            PBK_NAMESPACE=setup.namespace,
            PBK_LOG=str(setup.folder / f"{name}.jsonl"),
            PBK_LEASE=str(setup.lease),
            PBK_HEARTBEAT=str(min(2.0, setup.lease / 4)),
            PBK_RECOVER=str(min(1.0, setup.lease / 4)),
            PBK_TASK_SECONDS=str(setup.task_seconds),
            **setup.durability_env("PBK_"),
        )
        args = [sys.executable, str(protean / "pworker.py"), "engine"]
        return Command(args, env, output_says("pworker ready"), cwd=protean)

    def producer(self, setup: Setup, url: str) -> Producer:
        return _ProteanProducer(url, setup)

    def holds(self, queue: str) -> bool:
        """The groups' copies (``<log>--<group>``), not the stream's log or registrations."""
        return "--" in queue and not queue.endswith(("--at", "--dead"))


#: Whether papp's domain was initialized in this process (once only).
_PAPP_READY: list[bool] = []


class _ProteanProducer:
    def __init__(self, url: str, setup: Setup) -> None:
        from protean.domain import Domain

        from protean_simplebroker import SimpleBrokerBroker

        sys.path.insert(0, str(TESTS / "protean"))
        import papp

        self.papp = papp
        if not _PAPP_READY:
            papp.domain.init(traverse=False)  # the default (inline) broker: messages only
            _PAPP_READY.append(True)
        domain = Domain(name="nemesis-producer")
        conn = {"provider": "simplebroker", "URI": url, "NAMESPACE": setup.namespace}
        conn.update({k.upper(): v for k, v in setup.durability().items()})
        domain.config["brokers"]["default"] = conn
        self.broker = SimpleBrokerBroker("default", domain, conn)

    def send(self, key: str) -> str:
        with self.papp.domain.domain_context():
            return str(self.broker.publish(self.papp.STREAM, self.papp.order_message(key, "slow")))

    def close(self) -> None:
        self.broker.close()


# -- Dramatiq -------------------------------------------------------------------------------


class DramatiqLoad(Workload):
    """``dramatiq dramatiq_worker --processes 1 --threads 2`` (:mod:`.dramatiq_worker`), results."""

    name = "dramatiq"
    results = True

    def command(self, setup: Setup, name: str, url: str) -> Command:
        src = TESTS.parent / "src"
        env = base_env(setup, [HERE, TESTS, src, src / "integrations"])
        env.update(
            NEMESIS_URL=url,
            NEMESIS_NS=setup.namespace,
            NEMESIS_LOG=str(setup.folder / f"{name}.log"),
            NEMESIS_LEASE=str(setup.lease),
            **setup.durability_env("NEMESIS_"),
        )
        args = [sys.executable, "-m", "dramatiq", "dramatiq_worker"]
        args += ["--processes", "1", "--threads", "2"]
        return Command(args, env, output_says("is ready for action"), cwd=HERE)

    def producer(self, setup: Setup, url: str) -> Producer:
        return _DramatiqProducer(url, setup)

    def holds(self, queue: str) -> bool:
        """The queue's priority levels (``default.p<P>``), not its dead letters."""
        from .dramatiq_worker import QUEUE

        return queue == QUEUE or queue.startswith(f"{QUEUE}.p")

    def read_results(self, setup: Setup, refs: dict[str, str]) -> dict[str, Result]:
        import dramatiq
        from dramatiq.results import ResultFailure, ResultMissing

        from .dramatiq_worker import QUEUE, make_broker

        broker = make_broker(setup.admin_url, setup.namespace, setup.lease)
        backend = broker.get_results_backend()
        out = {}
        try:
            for key, ref in refs.items():
                message: dramatiq.Message[Any] = dramatiq.Message(
                    queue_name=QUEUE,
                    actor_name="witness",
                    args=(),
                    kwargs={},
                    options={},
                    message_id=ref,
                )
                try:
                    value = backend.get_result(message)
                except ResultMissing:
                    out[key] = Result("MISSING", None, right=False)
                    continue
                except ResultFailure as exc:
                    out[key] = Result(f"FAILURE:{exc}", None, right=False)
                    continue
                pid, right = witnessed(value, key)
                out[key] = Result("SUCCESS", pid, right)
        finally:
            broker.close()
        return out


class _DramatiqProducer:
    def __init__(self, url: str, setup: Setup) -> None:
        from .dramatiq_worker import declare, make_broker

        def never(*args: object) -> None:
            raise AssertionError("the witness actor runs in the workers")

        self.seconds = setup.task_seconds
        self.broker = make_broker(url, setup.namespace, setup.lease, setup.durability())
        self.actor = declare(self.broker, never)

    def send(self, key: str) -> str:
        return str(self.actor.send(key, self.seconds).message_id)

    def close(self) -> None:
        self.broker.close()


#: Every workload, by name.
WORKLOADS: dict[str, Workload] = {
    load.name: load
    for load in (QueueLoad(), TaskiqLoad(), CeleryLoad(), ProteanLoad(), DramatiqLoad())
}
