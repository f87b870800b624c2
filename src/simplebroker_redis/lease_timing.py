"""How long a worker's reservations live, and how often its heartbeat renews and recovers.

The Taskiq, Celery, Protean and Dramatiq integrations each take these
settings in their own words (keyword arguments, ``broker_transport_options``,
a Protean broker table) and raise their own error types; what the settings
mean is decided here, once: the defaults, and the rule that a heartbeat
comes at least twice per lease (:func:`lease_timing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .validation import number_problem

#: Seconds a reservation lives without renewal: a dead worker's messages return after it.
DEFAULT_LEASE_SECONDS: Final[float] = 10.0

#: Most seconds between two renewals of a worker's heartbeat, when not given.
DEFAULT_HEARTBEAT_SECONDS: Final[float] = 2.0

#: Most seconds between two recovery passes over expired reservations, when not given.
DEFAULT_RECOVER_SECONDS: Final[float] = 1.0

#: Share of the lease a heartbeat interval takes when not given: four renewals per lease.
DEFAULT_HEARTBEAT_SHARE: Final[float] = 0.25

#: Largest share of the lease between two renewals: a renewal that fails once
#: (a blip, a failover) is retried while the lease still runs.
MAX_HEARTBEAT_SHARE: Final[float] = 0.5


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """How long a worker's reservations live, and how often its heartbeat acts."""

    lease_seconds: float = DEFAULT_LEASE_SECONDS  #: lifetime of a reservation without renewal
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS  #: between two renewals
    recover_seconds: float = DEFAULT_RECOVER_SECONDS  #: between two recovery passes


class TimingError(ValueError):
    """A lease timing is refused: ``name`` (the caller's word for it) must be ``problem``."""

    def __init__(self, name: str, problem: str, value: object) -> None:
        super().__init__(f"{name} must be {problem}")
        self.name = name
        self.problem = problem
        self.value = value


def _seconds(name: str, value: object) -> float:
    problem = number_problem(value, bound=0, side=">")
    if problem is not None:
        raise TimingError(name, problem, value)
    return float(value)  # type: ignore[arg-type] # a number, checked above


def lease_timing(
    lease: object = None,
    heartbeat: object = None,
    recover: object = None,
    *,
    names: tuple[str, str, str] = ("lease_seconds", "heartbeat_interval", "recover_interval"),
) -> LeaseTiming:
    """Return the checked timing of a worker; None takes the default.

    Defaults: the lease :data:`DEFAULT_LEASE_SECONDS`; the heartbeat a
    quarter of the lease, at most :data:`DEFAULT_HEARTBEAT_SECONDS`; the
    recovery passes as often as the heartbeat, at most every
    :data:`DEFAULT_RECOVER_SECONDS`. ``names`` are the caller's names of
    the three settings, for the error.

    Raises:
        TimingError: A value is not a finite number > 0, or the heartbeat
            interval is longer than half the lease.

    """
    lease_name, heartbeat_name, recover_name = names
    lease_s = _seconds(lease_name, DEFAULT_LEASE_SECONDS if lease is None else lease)
    if heartbeat is None:
        heartbeat = min(DEFAULT_HEARTBEAT_SECONDS, lease_s * DEFAULT_HEARTBEAT_SHARE)
    heartbeat_s = _seconds(heartbeat_name, heartbeat)
    if heartbeat_s > lease_s * MAX_HEARTBEAT_SHARE:
        raise TimingError(heartbeat_name, f"at most half of {lease_name} ({lease_s:g})", heartbeat)
    if recover is None:
        recover = min(DEFAULT_RECOVER_SECONDS, heartbeat_s)
    return LeaseTiming(lease_s, heartbeat_s, _seconds(recover_name, recover))
