"""Real concurrency: writer and claimer processes on one queue, threads on one handle."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from simplebroker_redis import redis_backend_plugin

WRITE_SECONDS = 10.0
QUEUE = "race"


def _core(url: str, namespace: str):
    return redis_backend_plugin.create_core(url, backend_options={"namespace": namespace})


def _writer(url: str, namespace: str, writer: int, start: Any) -> dict[str, list[Any]]:
    """Write ``"<writer>:<n>"`` for WRITE_SECONDS; every 5th write also allocate a bare ID."""
    core = _core(url, namespace)
    written: list[int] = []
    stamps: list[int] = []
    sequence: list[int] = []  # every ID this process got, in call order
    stamp_errors: list[str] = []
    start.wait(120)  # every process has imported and connected: the race starts together
    deadline = time.time() + WRITE_SECONDS
    n = 0
    while time.time() < deadline:
        written.append(core.write(QUEUE, f"{writer}:{n}"))
        sequence.append(written[-1])
        n += 1
        if n % 5 == 0:
            try:
                stamps.append(core.generate_timestamp())
            except Exception as exc:  # noqa: BLE001 - reported after the other checks
                stamp_errors.append(f"{type(exc).__name__}: {exc}")
            else:
                sequence.append(stamps[-1])
    return {
        "written": written,
        "stamps": stamps,
        "sequence": sequence,
        "stamp_errors": stamp_errors,
    }


def _claimer(url: str, namespace: str, start: Any) -> list[tuple[str, int]]:
    """Claim batches until the writers are done and the queue stays empty."""
    core = _core(url, namespace)
    claimed: list[tuple[str, int]] = []
    start.wait(120)
    done_at = time.time() + WRITE_SECONDS + 0.5
    while True:
        batch = core.claim_many(QUEUE, 20)
        claimed.extend(batch)
        if not batch:
            if time.time() > done_at:
                return claimed
            time.sleep(0.001)


@pytest.mark.slow
def test_writer_and_claimer_processes_lose_and_duplicate_nothing(redis_url, namespace, broker):
    broker.write("warm", "up")  # the namespace exists before the race starts
    context = multiprocessing.get_context("spawn")
    # A barrier, not a start time: on a busy machine a spawned interpreter can
    # take longer to import than any fixed head start (its window then passed
    # before it wrote anything). Six tasks on six processes all wait at once.
    with context.Manager() as manager, ProcessPoolExecutor(6, mp_context=context) as pool:
        start = manager.Barrier(6)
        writers = [pool.submit(_writer, redis_url, namespace, k, start) for k in range(4)]
        claimers = [pool.submit(_claimer, redis_url, namespace, start) for _ in range(2)]
        written = [future.result(timeout=180) for future in writers]
        claimed = [future.result(timeout=180) for future in claimers]

    # Whatever is left is claimed here, so every message is accounted for.
    leftover = broker.claim_many(QUEUE, 1_000_000)
    ids_by_body = {
        f"{k}:{n}": message_id
        for k, result in enumerate(written)
        for n, message_id in enumerate(result["written"])
    }
    assert len(ids_by_body) > 400  # the race actually happened
    all_written = [message_id for result in written for message_id in result["written"]]
    all_stamps = [stamp for result in written for stamp in result["stamps"]]
    # IDs are unique across processes, increasing within each.
    assert len(set(all_written) | set(all_stamps)) == len(all_written) + len(all_stamps)
    for result in written:
        sequence = result["sequence"]
        assert sequence == sorted(sequence) and len(set(sequence)) == len(sequence)
    # Every message was claimed exactly once, with the ID its writer got.
    every_claim = [row for rows in claimed for row in rows] + leftover
    duplicates = [body for body, count in Counter(b for b, _ in every_claim).items() if count > 1]
    assert duplicates == []
    assert dict(every_claim) == ids_by_body
    # Each claimer saw strictly increasing IDs (oldest-first, exactly once).
    for rows in claimed:
        ids = [message_id for _, message_id in rows]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(rows for rows in claimed)  # both claimers took part
    assert broker.get_queue_stat(QUEUE).pending == 0  # claimed rows may be auto-vacuumed
    assert broker.refresh_last_timestamp() == max(all_written + all_stamps)
    # generate_timestamp() must not give up while other processes write.
    assert [error for result in written for error in result["stamp_errors"]] == []


# -- threads sharing one handle (redis and the SQLite reference) ----------------------------


def _run(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)


def _thread(errors: list[BaseException], work: Callable[[], None]) -> threading.Thread:
    """A thread running ``work``; an exception is kept for the main thread to report."""

    def guarded() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - asserted empty by the test
            errors.append(exc)

    return threading.Thread(target=guarded)


def test_threads_writing_and_claiming_on_one_handle(sb):
    per_writer, writers = 100, 4
    written: list[tuple[str, int]] = []
    claimed: list[tuple[str, int]] = []
    writers_done = threading.Event()
    errors: list[BaseException] = []

    def write(k: int) -> None:
        for n in range(per_writer):
            body = f"{k}:{n}"
            written.append((body, sb.write(QUEUE, body)))

    def claim() -> None:
        while True:
            row = sb.claim_one(QUEUE)
            if row is not None:
                claimed.append(row)
            elif writers_done.is_set() and not sb.has_pending_messages(QUEUE):
                return
            else:
                time.sleep(0.0005)

    claimers = [_thread(errors, claim) for _ in range(4)]
    for thread in claimers:
        thread.start()
    _run([_thread(errors, lambda k=k: write(k)) for k in range(writers)])
    writers_done.set()
    for thread in claimers:
        thread.join(timeout=60)
    assert errors == []
    assert len(written) == per_writer * writers
    assert len({message_id for _, message_id in written}) == len(written)
    assert sorted(claimed) == sorted(written)
    assert sb.get_queue_stat(QUEUE).claimed == len(written)


def test_threads_racing_for_the_same_messages_have_one_winner_each(sb):
    ids = [sb.write(QUEUE, f"m{i}") for i in range(40)]
    wins: list[tuple[str, str, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def race(kind: str) -> None:
        barrier.wait()
        for message_id in ids:
            if kind == "claim":
                row = sb.claim_one(QUEUE, exact_timestamp=message_id)
            else:
                row = sb.move_one(QUEUE, "moved", exact_timestamp=message_id)
            if row is not None:
                with lock:
                    wins.append((kind, row[0], row[1]))

    _run([threading.Thread(target=race, args=(kind,)) for kind in ("claim", "move") * 3])
    assert sorted(message_id for _, _, message_id in wins) == ids
    kinds = Counter(kind for kind, _, _ in wins)
    assert sb.get_queue_stat(QUEUE).claimed == kinds["claim"]
    assert sb.get_queue_stat(QUEUE).pending == 0
    assert sb.get_queue_stat("moved").pending == kinds["move"]
    assert sorted(body for _, body, _ in wins) == sorted(f"m{i}" for i in range(40))
