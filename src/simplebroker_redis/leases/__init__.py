"""Reservations with renewable leases: :class:`Leases` and its asyncio twin :class:`AsyncLeases`."""

from .aio import AsyncLeases
from .sync import LeaseCalls, Leases, Reservations

__all__ = ["AsyncLeases", "LeaseCalls", "Leases", "Reservations"]
