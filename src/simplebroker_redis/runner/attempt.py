"""The attempt/remedy loop: the one failure rule around the tries of a call.

:class:`Attempt` decides, after each failed try, whether the call is tried
again, after which *remedy* (initialize the namespace, load the Functions
library or a script, read the key types of a ``WRONGTYPE``), or after which
pause (a Cluster or Sentinel reply that says nothing ran); everything else
is translated into SimpleBroker's exceptions
(:func:`~simplebroker_redis.errors.translate`). Both runners drive it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, Final

import redis
import redis.exceptions as rx
from simplebroker.ext import DataError

from ..calls import Call, key_types
from ..calls import init as init_call
from ..connection import Address
from ..errors import NamespaceMissing, WrongType, translate
from ..keys import Keyspace
from ..scripts import ScriptName, library, script_source

_POOL_EXHAUSTED = "No connection available."
_FUNCTION_MISSING = "Function not found"

#: First and longest pause between retries of a refused command (seconds).
REFUSED_PAUSE: Final[tuple[float, float]] = (0.02, 0.5)

# redis-py's words for a connection that could not be opened (nothing was
# sent), and SentinelManagedConnection's for a READONLY reply.
_NOT_SENT_RE: Final = re.compile(
    r"(?i)error [-\d]+ connecting to|connecting to the cluster|connection refused|"
    r"timeout connecting|previous master is now a slave|no master found"
)


def _loaded(reply: Any) -> None:
    return None


#: Loads the Functions library (idempotent: the same name replaces itself).
LOAD_LIBRARY: Final[Call[None]] = Call(
    _loaded, command=lambda client: client.function_load(library(), replace=True)
)


def load_script(name: ScriptName) -> Call[None]:
    """Return the call that loads script ``name`` for EVALSHA (after NOSCRIPT)."""
    source = script_source(name)
    return Call(_loaded, command=lambda client: client.script_load(source))


class Attempt:
    """The failure rule around the attempts of one call (a context manager).

    ``with attempt:`` wraps one try. On a redis-py error it raises the
    translated exception, unless the call may be repeated after a *remedy*:
    another call the runner makes first (:attr:`remedy`), whose reply goes to
    :meth:`remedied`:

    - the namespace was found missing: initialize it, then try once more;
    - the Functions library is missing (a server restart, a new cluster
      node): load it, then try once more (nothing ran before);
    - a key had the wrong type (the server does not say which): read the
      key types, and raise a ``DataError`` naming the damaged key.

    An idempotent call is also tried once more after a connection error
    (no remedy). With a ``deadline`` (Cluster, Sentinel), a reply that says
    the command was refused before it ran is retried until the deadline:
    MOVED re-points the route (``moved``), ASK sends the next try to the
    node it names, the others pause first (:attr:`pause`). Any other
    connection error makes the route ask where the primary is next time.
    """

    __slots__ = (
        "_deadline",
        "_moved",
        "_next_ask",
        "_refusals",
        "_remedy",
        "_tried",
        "ask",
        "call",
        "keys",
        "pause",
        "where",
        "wrong_type",
    )

    def __init__(
        self,
        where: str,
        keys: Keyspace,
        call: Call[Any],
        *,
        deadline: float | None = None,
        moved: Callable[[Address | None], None] | None = None,
    ) -> None:
        self.where = where
        self.keys = keys
        self.call = call
        self.wrong_type: WrongType | None = None
        self._remedy: Call[Any] | None = None
        self._tried: set[str] = set()  #: what was done again already (each at most once)
        self._deadline = deadline
        self._moved = moved
        self._refusals = 0
        self._next_ask: Address | None = None
        self.ask: Address | None = None  #: this try goes to that node, after ASKING
        self.pause = 0.0  #: seconds to wait before the next try

    def __enter__(self) -> None:
        self._remedy = None
        self.pause = 0.0
        self.ask, self._next_ask = self._next_ask, None

    def _refused(self, exc: redis.RedisError) -> bool:
        """Return whether to try again: ``exc`` says nothing ran, and time is left."""
        refused = (
            isinstance(
                exc,
                (rx.AskError, rx.TryAgainError, rx.ClusterDownError, rx.ReadOnlyError),
            )
            or (
                isinstance(exc, (rx.ConnectionError, rx.TimeoutError))
                and (isinstance(exc, rx.BusyLoadingError) or bool(_NOT_SENT_RE.search(str(exc))))
            )
            or (isinstance(exc, rx.ResponseError) and str(exc).startswith("BUSY"))
        )
        if not refused:
            if isinstance(exc, (rx.ConnectionError, rx.TimeoutError)) and self._moved:
                self._moved(None)  # the primary may have changed: ask next time
            return False
        assert self._deadline is not None
        if time.monotonic() >= self._deadline:
            return False
        if isinstance(exc, rx.MovedError):
            if self._moved:
                self._moved((str(exc.host), int(exc.port)))
        elif isinstance(exc, rx.AskError):
            self._next_ask = (str(exc.host), int(exc.port))
        else:
            if self._moved and not isinstance(exc, (rx.TryAgainError, rx.BusyLoadingError)):
                self._moved(None)
            first, longest = REFUSED_PAUSE
            self.pause = min(longest, first * 2**self._refusals)
            self._refusals += 1
        return True

    def _once(self, what: str) -> bool:
        if what in self._tried:
            return False
        self._tried.add(what)
        return True

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if not isinstance(exc, redis.RedisError):
            return False
        if self._deadline is not None and self._refused(exc):
            return True
        error = translate(exc, self.where, changing=self.call.changes)
        if isinstance(error, WrongType) and self._once("types"):
            error.__cause__ = exc
            self.wrong_type = error
            self._remedy = key_types(self.keys)
            return True
        if self.call.script is not None:
            if isinstance(error, NamespaceMissing) and self.call.script != "init":
                self._remedy = init_call("init") if self._once("init") else None
            elif _FUNCTION_MISSING in str(exc):
                # Once per node: an ASK target may lack it while the source has it.
                self._remedy = LOAD_LIBRARY if self._once(f"load {self.ask}") else None
            elif isinstance(exc, rx.NoScriptError):
                load = self._once(f"load {self.ask}")
                self._remedy = load_script(self.call.script) if load else None
            if self._remedy is not None:
                return True
        if (
            self.call.idempotent
            and isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
            and str(exc) != _POOL_EXHAUSTED
            and self._once("reconnect")
        ):
            return True
        raise error from exc

    @property
    def remedy(self) -> Call[Any] | None:
        """Return the call to make before the next try, if any."""
        return self._remedy

    def remedied(self, reply: Any) -> None:
        """Take the remedy's reply; raise when it ends the call (damaged data)."""
        if self.wrong_type is not None:
            raise self.damaged(reply)

    def damaged(self, types: dict[str, tuple[str, str]]) -> DataError:
        """Return the error for :attr:`wrong_type`, naming the first wrong-typed key found."""
        assert self.wrong_type is not None
        for key, (kind, expected) in types.items():
            if kind not in ("none", expected):
                error = DataError(
                    f"damaged simplebroker-redis data in {self.where}: {key} holds a "
                    f"{kind}, expected a {expected}"
                )
                error.__cause__ = self.wrong_type
                return error
        return self.wrong_type
