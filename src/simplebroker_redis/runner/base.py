"""``RunnerBase``: what the sync and the asyncio runner share.

The options, the connection settings
(:class:`~simplebroker_redis.connection.Connections`), the key schema, the
naming used in errors, how a :class:`~simplebroker_redis.calls.Call`
becomes a script run, and the pieces of one run: its
:class:`~.attempt.Attempt` (the failure rule) and the runner's
:class:`~.durability.Durability` (WAIT/WAITAOF).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

from simplebroker import BrokerTarget

from ..calls import Call
from ..connection import Address, Connections
from ..keys import Keyspace
from ..options import BackendOptions, OptionKwargs
from ..scripts import function_name, script_sha
from ..validation import message_size_limit
from .attempt import Attempt
from .durability import Durability

if TYPE_CHECKING:
    from simplebroker.ext import BackendPlugin


class RunnerBase:
    """Options, connection settings, keys and the failure rule of both runners.

    Args:
        target: ``redis://``, ``rediss://`` or ``unix://`` URL (with db number).
        options: Validated backend options; or pass them as keywords
            (``namespace=``, ``max_connections=``, ``pool_timeout=``,
            ``stale_batch_seconds=``), defaults in :mod:`.options`.
        config: SimpleBroker config (busy timeout, ``BROKER_BACKEND_PASSWORD``);
            the environment when omitted.

    """

    #: The ``redis`` backend plugin (SimpleBroker's ``BackendAwareRunner``
    #: contract). A back-pointer assigned once by :mod:`.plugin`, so this
    #: lower layer never imports the plugin.
    backend_plugin: ClassVar[BackendPlugin]

    def __init__(
        self,
        target: str,
        options: BackendOptions | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        **option_kwargs: Unpack[OptionKwargs],
    ) -> None:
        if options is None:
            options = BackendOptions.parse(option_kwargs)
        elif option_kwargs:
            raise TypeError("pass options or option keywords, not both")
        self.options = options
        self.config = config
        #: Largest message its writers accept (``BROKER_MAX_MESSAGE_SIZE`` of
        #: ``config``, else of the environment: :func:`.message_size_limit`).
        self.max_message_size = message_size_limit(config)
        self.connections = Connections(target, options, config)
        self.target = self.connections.target
        self.pool_timeout = self.connections.pool_timeout
        self.keys = Keyspace.for_namespace(options.namespace)
        self.where = f"{self.connections.redacted} namespace={options.namespace!r}"
        self.durability = Durability(options, self.where)
        self._fixed_keys = tuple(self.keys.fixed_keys)
        self._init_state()

    def _init_state(self) -> None:
        """Set up the subclass's own state (pools, caches); called by ``__init__``."""

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({self.connections.redacted!r}, namespace={self.keys.namespace!r})"

    @property
    def identity(self) -> tuple[str, str | None, str]:
        """Return what makes two runners address the same namespace."""
        return (*self.connections.identity, self.options.namespace)

    @property
    def broker_target(self) -> BrokerTarget:
        """Return the SimpleBroker target this runner addresses.

        Pass it with the runner, ``Queue(name, db_path=runner.broker_target,
        runner=runner)``, so SimpleBroker does not look for a project file.
        """
        return BrokerTarget(
            backend_name="redis", target=self.target, backend_options=self.options.to_dict()
        )

    def _operation(self, call: Call[Any], command: tuple[Any, ...] | None) -> Callable[[Any], Any]:
        """Return ``call`` as a function of a client or pipeline (sync or asyncio alike).

        ``command`` is the script's command (:meth:`_script_command`), sent
        as it is by ``execute_command``; None for a call of plain commands,
        whose own function is returned.
        """
        if command is None:
            assert call.command is not None, "a Call names a script or a command"
            return call.command
        return lambda client: client.execute_command(*command)

    def _script_command(self, call: Call[Any]) -> tuple[Any, ...]:
        """Return the FCALL (or EVALSHA) command that runs ``call``'s script."""
        assert call.script is not None, "a Call names a script or a command"
        keys = (*self._fixed_keys, *call.extra_keys) if call.extra_keys else self._fixed_keys
        if self.options.scripting == "eval":
            head: tuple[Any, ...] = ("EVALSHA", script_sha(call.script))
        else:
            head = ("FCALL", function_name(call.script))
        return (*head, len(keys), *keys, self.keys.wake_prefix, *call.args)

    def _attempt(self, call: Call[Any], moved: Callable[[Address | None], None]) -> Attempt:
        """Return the failure rule for ``call``'s tries (a deadline on Cluster and Sentinel)."""
        deadline = time.monotonic() + self.pool_timeout if self.connections.routed else None
        return Attempt(self.where, self.keys, call, deadline=deadline, moved=moved)


def plain_call(
    operation: Callable[[Any], Any], *, idempotent: bool = False, writes: bool = False
) -> Call[Any]:
    """Return plain commands ``operation(client)`` as a call (the runners' ``execute``).

    Its reply is what ``operation`` returns (awaited, on the asyncio runner).

    ``writes``: ``operation`` is one command that changes data; with the
    durability options WAIT/WAITAOF follow it.
    """
    return Call(_same, command=operation, idempotent=idempotent, writes=writes)


def _same(value: Any) -> Any:
    return value
