"""``python -m simplebroker_redis.dashboard``: serve the dashboard of one namespace."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Final

from ..cli import log_to_stderr, tool_parser, tool_target
from .access import parse_basic

#: Environment variable that may hold the token instead of ``--token``.
TOKEN_ENV: Final[str] = "SIMPLEBROKER_DASHBOARD_TOKEN"

#: Environment variable that may hold ``user:password`` instead of ``--basic-auth``.
BASIC_ENV: Final[str] = "SIMPLEBROKER_DASHBOARD_BASIC_AUTH"

#: Port of the dashboard when none is given.
DEFAULT_PORT: Final[int] = 8808


def build_parser() -> argparse.ArgumentParser:
    """Return the command line parser of the dashboard."""
    parser = tool_parser(
        "python -m simplebroker_redis.dashboard",
        "Serve a live web dashboard of one simplebroker-redis namespace.",
        DEFAULT_PORT,
    )
    parser.add_argument(
        "--bind",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs a token)",
    )
    parser.add_argument(
        "--token",
        help=f"require this token (or ${TOKEN_ENV}); open /?token=... once per browser",
    )
    parser.add_argument(
        "--basic-auth",
        metavar="USER:PASSWORD",
        help=f"require this HTTP basic-auth login (or ${BASIC_ENV})",
    )
    parser.add_argument(
        "--allow-actions",
        action="store_true",
        help="allow retrying, deleting and purging dead letters from the page (read-only "
        "without); needs a login: without --token or --basic-auth a token is made and printed",
    )
    parser.add_argument(
        "--root-path",
        default="",
        help="the path prefix a reverse proxy serves the dashboard under (e.g. /broker); "
        "the proxy strips it before passing requests on",
    )
    return parser


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the dashboard until interrupted."""
    args = build_parser().parse_args(argv)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    basic_text = args.basic_auth or os.environ.get(BASIC_ENV) or None
    try:
        basic = parse_basic(basic_text) if basic_text else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not _loopback(args.bind) and token is None and basic is None:
        print(
            f"error: --bind {args.bind} serves other machines: give a --token (or ${TOKEN_ENV})"
            f" or --basic-auth (or ${BASIC_ENV})",
            file=sys.stderr,
        )
        return 2
    root = args.root_path.rstrip("/")
    if root and not root.startswith("/"):
        print("error: --root-path must start with '/'", file=sys.stderr)
        return 2
    made_token = args.allow_actions and token is None and basic is None
    if made_token:
        token = secrets.token_urlsafe(24)
    try:
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        print(
            f"error: the dashboard needs the 'dashboard' extra (starlette, uvicorn): {exc}",
            file=sys.stderr,
        )
        return 2
    target = tool_target(args)
    if target is None:
        return 2
    log_to_stderr()
    app = create_app(
        target.async_runner(), allow_actions=args.allow_actions, token=token, basic=basic
    )
    # Event streams never end by themselves: give open pages 3 s, then close them.
    config = uvicorn.Config(
        app,
        host=args.bind,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=3,
        root_path=root,
    )
    server = uvicorn.Server(config)
    mode = "actions allowed" if args.allow_actions else "read-only"
    print(f"dashboard of {target.describe()} (from {target.source}), {mode}", flush=True)
    url = f"http://{args.bind}:{args.port}{root}/"
    if made_token:
        print(f"actions need a login: open {url}?token={token}", flush=True)
    else:
        print(f"open {url}", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
