"""Queue aliases: a flat alias -> canonical queue map with a version."""

from __future__ import annotations

import time
import warnings

from .. import calls
from .._sbcompat import alias_shadow_warning, resolve_queue_operand
from ..validation import validate_queue_name
from ._base import CoreBase


class AliasesMixin(CoreBase):
    """Alias management; every mutation is one script that also bumps the version."""

    def get_alias_version(self) -> int:
        """Return the current alias version (changes on every alias mutation)."""
        key = self._runner.keys.meta
        value = self._runner.execute(
            lambda client: client.hget(key, "alias_version"), idempotent=True
        )
        return int(value or 0)

    def resolve_alias(self, name: str) -> str | None:
        """Return the canonical queue of alias ``name`` (one hop), or None."""
        key = self._runner.keys.aliases
        value = self._runner.execute(lambda client: client.hget(key, name), idempotent=True)
        return None if value is None else str(value)

    def canonicalize_queue(self, queue: str) -> str:
        """Resolve ``@alias`` operands; plain names are literal queue names."""
        return resolve_queue_operand(queue, self.resolve_alias)[0]

    def has_alias(self, name: str) -> bool:
        """Return whether alias ``name`` exists."""
        key = self._runner.keys.aliases
        return bool(self._runner.execute(lambda client: client.hexists(key, name), idempotent=True))

    def list_aliases(self) -> list[tuple[str, str]]:
        """Return every (alias, target), sorted by alias."""
        key = self._runner.keys.aliases
        raw = self._runner.execute(lambda client: client.hgetall(key), idempotent=True)
        return sorted((str(alias), str(target)) for alias, target in raw.items())

    def aliases_for_target(self, target: str) -> list[str]:
        """Return the sorted aliases that point at ``target``."""
        return [alias for alias, value in self.list_aliases() if value == target]

    def add_alias(self, name: str, target: str) -> None:
        """Add alias ``name`` -> ``target`` after validating the live alias map."""
        self._guard("add_alias")
        if name == target:
            raise ValueError("Alias and target must differ")
        if target.startswith("@"):
            raise ValueError("Target names should not include the '@' prefix")
        if not target:
            raise ValueError("Alias target cannot be empty")
        validate_queue_name(name)
        validate_queue_name(target)
        shadows = self._run(calls.probe_exists(name))
        self._run(calls.alias_add(name, target, time.time_ns()))
        if shadows and not alias_shadow_warning.suppressed():
            warnings.warn(
                f"Queue '{name}' already exists with messages. The alias @{name} "
                f"will redirect to '{target}' while the queue {name} remains "
                "accessible directly.",
                alias_shadow_warning.category,
                stacklevel=2,
            )

    def remove_alias(self, name: str) -> None:
        """Remove alias ``name`` (messages stay in the canonical queue)."""
        self._guard("remove_alias")
        self._run(calls.alias_remove(name, time.time_ns()))
