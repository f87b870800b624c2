"""The query options a target may carry: which names, what values, and what to hide.

redis-py reads a target's query as connection options for every
connection of the runner. :mod:`.targets` accepts exactly the names listed
here (with values that pass their check), so a typo in an option name is
refused instead of reaching redis-py as an unknown keyword.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final
from urllib.parse import unquote_plus

from .validation import number_problem

# Only words redis-py reads the same way ("off" would be True to it).
_FALSE_WORDS: Final[frozenset[str]] = frozenset({"false", "no", "0"})
_TRUE_WORDS: Final[frozenset[str]] = frozenset({"true", "yes", "1"})
_CERT_REQS: Final[frozenset[str]] = frozenset({"none", "optional", "required"})
_MAX_DIGITS: Final[int] = 10
_SECRET_NAME_RE: Final = re.compile(r"(?i)pass|secret|token|auth|cred")


def _seconds(value: str) -> str | None:
    try:
        number = float(value)
    except ValueError:
        return "seconds (a number > 0)"
    return None if number_problem(number, bound=0, side=">") is None else "seconds (a number > 0)"


def _whole(value: str) -> str | None:
    return None if value.isdigit() and len(value) <= _MAX_DIGITS else "an integer >= 0"


def _flag(value: str) -> str | None:
    return None if value.lower() in _FALSE_WORDS | _TRUE_WORDS else "true or false"


def _text(value: str) -> str | None:
    return None if value.strip() == value and " " not in value else "text without spaces"


def _path(value: str) -> str | None:
    return None if value.strip() else "a file or directory path"


def _cert_reqs(value: str) -> str | None:
    return None if value in _CERT_REQS else "none, optional or required"


#: redis-py connection options a target's query may carry, with their checks
#: (each returns what the value should be, or None when it is fine).
QUERY_OPTIONS: Final[dict[str, Callable[[str], str | None]]] = {
    "socket_timeout": _seconds,
    "socket_connect_timeout": _seconds,
    "socket_keepalive": _flag,
    "health_check_interval": _whole,
    "client_name": _text,
}

#: Options that only a TLS target (``rediss://``, ``rediss+...``) may carry.
TLS_QUERY_OPTIONS: Final[dict[str, Callable[[str], str | None]]] = {
    "ssl_certfile": _path,
    "ssl_keyfile": _path,
    "ssl_ca_certs": _path,
    "ssl_ca_path": _path,
    "ssl_cert_reqs": _cert_reqs,
    "ssl_check_hostname": _flag,
}


def option_check(name: str, data_scheme: str) -> Callable[[str], str | None] | str:
    """Return the check of query option ``name``, or the fault of naming it here."""
    if name == "db":
        if data_scheme == "unix":
            return _whole
        return "give the db in the path (redis://host:port/DB), not as option"
    check = QUERY_OPTIONS.get(name)
    if check is not None:
        return check
    tls = TLS_QUERY_OPTIONS.get(name)
    if tls is not None:
        return tls if data_scheme == "rediss" else "a TLS target (rediss://) is needed for option"
    known = ", ".join([*QUERY_OPTIONS, *TLS_QUERY_OPTIONS, "db (unix://)"])
    return f"unknown option (known: {known}):"


def hide_secret_values(text: str) -> str:
    """Return ``text`` with the values of password-like query options replaced by ``***``."""
    head, mark, query = text.partition("?")
    if not mark:
        return text
    items = []
    for item in query.split("&"):
        name, equals, value = item.partition("=")
        secret = equals and value and _SECRET_NAME_RE.search(unquote_plus(name))
        items.append(f"{name}=***" if secret else item)
    return f"{head}?{'&'.join(items)}"
