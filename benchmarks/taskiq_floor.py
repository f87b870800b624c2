"""Worker CPU per task inside one process: Taskiq's own floor versus our broker.

``python benchmarks/taskiq_floor.py [--tasks N] [--prefetch P]``

Runs Taskiq's ``Receiver`` in this process (no ``taskiq worker``, no
per-task report socket) over N pre-kicked trivial tasks, twice:

- a *null* broker whose ``listen`` yields ready messages and whose ack does
  nothing: what Taskiq itself costs per task;
- ``SimpleBrokerTaskiqBroker`` on a throwaway server, results off and on,
  with the round trips per task of each script.

The difference is what the broker costs. Not part of ``run.py``; prints only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
from collections.abc import AsyncGenerator
from typing import Any

from taskiq import AckableMessage, AsyncBroker, BrokerMessage
from taskiq.receiver import Receiver


async def noop(i: int) -> int:
    return i


class NullBroker(AsyncBroker):
    """Yields pre-made messages; kick records them; ack does nothing."""

    def __init__(self, messages: list[bytes]) -> None:
        super().__init__()
        self.messages = messages
        self.acked = 0

    async def kick(self, message: BrokerMessage) -> None:
        self.messages.append(message.message)

    async def listen(self) -> AsyncGenerator[AckableMessage, None]:
        for raw in self.messages:
            yield AckableMessage(data=raw, ack=self._ack)
        await asyncio.Event().wait()

    async def _ack(self) -> None:
        self.acked += 1


async def drain(broker: AsyncBroker, done: Any, n: int) -> float:
    """Run a Receiver until ``done()`` reaches ``n``; return CPU seconds used."""
    broker.is_worker_process = True
    await broker.startup()
    finish = asyncio.Event()
    receiver = Receiver(broker, max_async_tasks=100, max_prefetch=0)
    cpu = time.process_time()
    listening = asyncio.ensure_future(receiver.listen(finish))
    while done() < n:
        await asyncio.sleep(0.005)
    cpu = time.process_time() - cpu
    finish.set()
    listening.cancel()
    await asyncio.gather(listening, return_exceptions=True)
    await broker.shutdown()
    return cpu


async def null_floor(n: int) -> float:
    producer = NullBroker([])
    task = producer.register_task(noop, task_name="bench.noop")
    for i in range(n):
        await task.kiq(i)
    worker = NullBroker(producer.messages)
    worker.register_task(noop, task_name="bench.noop")
    return await drain(worker, lambda: worker.acked, n)


async def ours(url: str, n: int, prefetch: int, results: bool) -> tuple[float, dict[str, float]]:
    from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker

    namespace = f"floor-{'r' if results else 'n'}-{time.monotonic_ns()}"

    def make() -> Any:
        broker = SimpleBrokerTaskiqBroker(url, namespace=namespace, prefetch=prefetch)
        if results:
            backend = SimpleBrokerResultBackend(runner=broker.runner, result_ex_time=600)
            broker = broker.with_result_backend(backend)
        return broker

    producer = make()
    task = producer.register_task(noop, task_name="bench.noop")
    await producer.startup()
    for first in range(0, n, 250):
        await asyncio.gather(*(task.kiq(i) for i in range(first, min(n, first + 250))))
    await producer.shutdown()

    worker = make()
    done = 0

    async def counted(i: int) -> int:
        nonlocal done
        done += 1
        return i

    worker.register_task(counted, task_name="bench.noop")
    calls: collections.Counter[str] = collections.Counter()
    run = worker.runner.run

    async def counting(call: Any) -> Any:
        calls[call.script or "command"] += 1
        return await run(call)

    worker.runner.run = counting
    cpu = await drain(worker, lambda: done, n)
    return cpu, {name: count / n for name, count in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--prefetch", type=int, default=20)
    args = parser.parse_args()

    from simplebroker_redis.devserver import DevServer

    n = args.tasks
    floor = asyncio.run(null_floor(n))
    print(f"null broker (Taskiq alone): {floor / n * 1e6:6.1f} us CPU/task")
    server = DevServer()
    server.start()
    try:
        for results in (False, True):
            cpu, per_task = asyncio.run(ours(server.url, n, args.prefetch, results))
            scripts = ", ".join(f"{name} {value:.3f}" for name, value in sorted(per_task.items()))
            print(
                f"taskiq_simplebroker, results {'on ' if results else 'off'}: "
                f"{cpu / n * 1e6:6.1f} us CPU/task ({cpu / floor:.2f}x the floor); "
                f"scripts per task: {scripts}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
