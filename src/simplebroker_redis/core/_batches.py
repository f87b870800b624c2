"""At-least-once generators: whole batches reserved, yielded, then committed."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any, Unpack

from simplebroker import resolve_config

from ..errors import ReservationLost
from ..leases import Leases
from ..types import Lease
from ..validation import validate_queue_name
from ._base import CoreBase
from ._selection import Options, select

Row = tuple[str, int]

_CROSS_THREAD = (
    "an at_least_once generator was resumed on a thread other than the one that "
    "created it; its uncommitted batch was released (pending again) and the "
    "generator stopped. Create, iterate and close these generators on one thread."
)


def _expired(queue: str, lease_seconds: float | None) -> str:
    return (
        f"the lease of an at_least_once batch from {queue!r} ran out "
        f"(stale_batch_seconds={lease_seconds}) before all its messages were yielded; "
        "the rest were not handed out and the batch was released: its messages "
        "will be delivered again (another reader may have them already)"
    )


def _handed_out(
    lease: Lease,
    expires: float | None,
    owner: int,
    with_timestamps: bool,
    lease_seconds: float | None,
) -> Iterator[Row | str]:
    """Yield a batch's messages while its lease (``expires``, monotonic) lasts, on one thread."""
    for message in lease.messages:
        if expires is not None and time.monotonic() >= expires:
            raise ReservationLost(_expired(lease.queue, lease_seconds))
        yield (message.body, message.id) if with_timestamps else message.body
        if threading.get_ident() != owner:
            raise RuntimeError(_CROSS_THREAD)


class BatchesMixin(CoreBase):
    """``claim_generator``/``move_generator`` with ``at_least_once`` delivery.

    A batch is reserved under a token (one round trip), yielded, and settled
    only after its last message was yielded (one round trip). Closing the
    generator early releases the uncommitted batch: those messages are
    pending again with the same IDs and order. The reservation's lease is
    ``stale_batch_seconds`` from its creation; after that any reader may
    recover it, so a batch whose lease ran out (the process was stopped, or
    cut off from the server, for longer than that) yields nothing more: the
    next message is not handed out, the batch is released and
    :class:`~simplebroker_redis.ReservationLost` is raised (issue 42).
    """

    @staticmethod
    def _roll_back(leases: Leases, token: str, exc: BaseException, *, foreign: bool) -> None:
        """Release an uncommitted batch; never mask the exception that ended it."""
        if foreign:
            warnings.warn(_CROSS_THREAD, RuntimeWarning, stacklevel=3)
        try:
            leases.release(token)
        except Exception as failure:  # noqa: BLE001 - reported below, never raised over exc
            message = (
                f"releasing the uncommitted at_least_once batch failed ({failure!r}); "
                "its messages return after stale_batch_seconds"
            )
            if isinstance(exc, GeneratorExit):
                warnings.warn(message, RuntimeWarning, stacklevel=3)
            else:
                exc.add_note(message)

    def _batch_size(self, batch_size: int | None, config: Any) -> int:
        if batch_size is not None:
            return batch_size
        effective = self._config if config is None else resolve_config(config=config)
        return int(effective["GENERATOR_BATCH_SIZE"])

    def _reserved_batches(
        self, queue: str, target: str, with_timestamps: bool, **options: Unpack[Options]
    ) -> Iterator[Row | str]:
        """Reserve, yield and commit batches until the selection is empty (``target``: a move)."""
        validate_queue_name(queue)
        if target:
            validate_queue_name(target)
        selection = select(**options)
        stale_ns = self._runner.options.stale_batch_ns()
        lease_seconds = None if stale_ns is None else stale_ns / 1_000_000_000
        leases = Leases(self._runner)
        owner = threading.get_ident()
        while True:
            # Read before the request is sent: the lease starts on the server
            # after it, so this deadline comes before the server's, never after.
            sent = time.monotonic()
            lease = leases.reserve(
                queue,
                lease_seconds=lease_seconds,
                target=target,
                maintenance=self._maintenance_spec(),
                **selection,
            )
            if not lease.messages:
                return
            expires = None if lease_seconds is None else sent + lease_seconds
            committed = False
            try:
                self._open_batches[owner] = "move" if target else "claim"
                yield from _handed_out(lease, expires, owner, with_timestamps, lease_seconds)
                self._open_batches.pop(owner, None)
                outcome = leases.commit(lease.token, "move" if target else "claim")
                committed = True
                if outcome.lost:
                    raise ReservationLost(
                        f"{outcome.lost} message(s) of an at_least_once batch from "
                        f"{queue!r} outlived stale_batch_seconds and were recovered "
                        "before the batch committed; they may be delivered again"
                    )
                self._record_activity(outcome.settled)
            except BaseException as exc:
                self._open_batches.pop(owner, None)
                if not committed:
                    self._roll_back(
                        leases, lease.token, exc, foreign=threading.get_ident() != owner
                    )
                raise
            if selection["exact"] is not None:
                return
