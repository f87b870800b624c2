"""Who may look, and who may act: logins, read-only mode, CSRF.

- **Logins.** With a token (``--token``), every request must carry it:
  ``Authorization: Bearer <token>``, or the HttpOnly, SameSite=Strict
  cookie that opening ``/?token=<token>`` once sets. With basic auth
  (``--basic-auth user:password``) the browser asks for the login itself.
  Either guards every route; without one, only a dashboard on a loopback
  address serves, and only read-only.
- **Actions** (retry, delete, purge dead letters) need ``--allow-actions``
  *and* a login: a dashboard started with actions but no login makes a
  token and prints the URL that logs in with it. Read-only, every action
  is refused (403) before anything is read.
- **CSRF.** Every action must carry ``X-CSRF-Token``: a secret of this
  server that only a logged-in page can read (``GET /api/session``; no other
  site can, the browser's same-origin rule keeps its reply from them), and
  a request whose ``Origin`` names another host is refused. A form another
  site posts, or a script it runs, has neither. A token in a cookie or basic
  auth, which the browser sends by itself, is therefore never enough.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the command line reads parse_basic before Starlette is known to be there
    from starlette.requests import Request

#: Name of the cookie that carries the token after ``/?token=...``.
COOKIE: Final[str] = "sbr_dashboard"

#: Header every action must carry, holding :attr:`Access.csrf`.
CSRF_HEADER: Final[str] = "x-csrf-token"

#: The realm basic auth names in its challenge.
REALM: Final[str] = "simplebroker-redis dashboard"


def parse_basic(value: str) -> tuple[str, str]:
    """Return (user, password) of ``user:password``; raise ValueError when malformed."""
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ValueError("basic auth must be given as user:password (both non-empty)")
    return user, password


@dataclass(frozen=True)
class Access:
    """The dashboard's rules of access (see the module docstring)."""

    token: str | None = None
    basic: tuple[str, str] | None = None
    allow_actions: bool = False
    #: The secret every action carries (one per server process).
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @property
    def login_required(self) -> bool:
        """Return whether requests must log in."""
        return self.token is not None or self.basic is not None

    def logged_in(self, request: Request) -> bool:
        """Return whether ``request`` carries a valid login (always, when none is set)."""
        if not self.login_required:
            return True
        if self.token is not None:
            given = _bearer(request) or request.cookies.get(COOKIE)
            if given is not None and hmac.compare_digest(given, self.token):
                return True
        if self.basic is not None:
            given_basic = _basic(request)
            if given_basic is not None:
                user_ok = hmac.compare_digest(given_basic[0], self.basic[0])
                password_ok = hmac.compare_digest(given_basic[1], self.basic[1])
                return user_ok and password_ok
        return False

    def challenge(self) -> dict[str, str]:
        """Return the headers of a refusal that lets the browser ask for a login."""
        if self.basic is not None:
            return {"www-authenticate": f'Basic realm="{REALM}", charset="UTF-8"'}
        return {}

    def action_refusal(self, request: Request) -> str | None:
        """Return why ``request`` may not act, or None when it may."""
        if not self.allow_actions:
            return "actions are off: start the dashboard with --allow-actions"
        if not self.login_required:
            return "actions need a login: start the dashboard with --token or --basic-auth"
        if not self.logged_in(request):
            return "log in first"
        given = request.headers.get(CSRF_HEADER, "")
        if not given or not hmac.compare_digest(given, self.csrf):
            return f"missing or wrong {CSRF_HEADER} header (reload the page)"
        if not _same_origin(request):
            return "the request comes from another site"
        return None


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


def _basic(request: Request) -> tuple[str, str] | None:
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def _same_origin(request: Request) -> bool:
    """Return False when the browser says the request comes from another host."""
    origin = request.headers.get("origin")
    if origin is None:  # not a browser's cross-origin request (curl, a script)
        return True
    hosts = {request.headers.get("host", ""), request.headers.get("x-forwarded-host", "")}
    return urlsplit(origin).netloc in hosts - {""}
