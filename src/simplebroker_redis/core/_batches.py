"""At-least-once generators: whole batches reserved, yielded, then committed."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any, Unpack

from simplebroker import resolve_config

from ..errors import ReservationLost
from ..leases import Leases
from ..validation import validate_queue_name
from ._base import CoreBase
from ._selection import Options, select

Row = tuple[str, int]

_CROSS_THREAD = (
    "an at_least_once generator was resumed on a thread other than the one that "
    "created it; its uncommitted batch was released (pending again) and the "
    "generator stopped. Create, iterate and close these generators on one thread."
)


class BatchesMixin(CoreBase):
    """``claim_generator``/``move_generator`` with ``at_least_once`` delivery.

    A batch is reserved under a token (one round trip), yielded, and settled
    only after its last message was yielded (one round trip). Closing the
    generator early releases the uncommitted batch: those messages are
    pending again with the same IDs and order. The reservation's lease is
    ``stale_batch_seconds`` from its creation; after that any reader may
    recover it.
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
            lease = leases.reserve(
                queue,
                lease_seconds=lease_seconds,
                target=target,
                maintenance=self._maintenance_spec(),
                **selection,
            )
            if not lease.messages:
                return
            committed = False
            try:
                self._open_batches[owner] = "move" if target else "claim"
                for message in lease.messages:
                    yield (message.body, message.id) if with_timestamps else message.body
                    if threading.get_ident() != owner:
                        raise RuntimeError(_CROSS_THREAD)
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
