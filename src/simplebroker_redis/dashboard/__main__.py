"""``python -m simplebroker_redis.dashboard``: serve the dashboard of one namespace."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Sequence
from typing import Final

from ..observe import async_runner
from ..opscli import log_to_stderr, tool_parser, tool_target

#: Environment variable that may hold the token instead of ``--token``.
TOKEN_ENV: Final[str] = "SIMPLEBROKER_DASHBOARD_TOKEN"

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
        "--allow-actions",
        action="store_true",
        help="allow requeueing and purging dead letters from the page (read-only without)",
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
    if not _loopback(args.bind) and token is None:
        print(
            f"error: --bind {args.bind} serves other machines: give a --token (or ${TOKEN_ENV})",
            file=sys.stderr,
        )
        return 2
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
    app = create_app(async_runner(target), allow_actions=args.allow_actions, token=token)
    # Event streams never end by themselves: give open pages 3 s, then close them.
    config = uvicorn.Config(
        app, host=args.bind, port=args.port, log_level="warning", timeout_graceful_shutdown=3
    )
    server = uvicorn.Server(config)
    mode = "actions allowed" if args.allow_actions else "read-only"
    print(f"dashboard of {target.describe()} (from {target.source}), {mode}", flush=True)

    print(f"open http://{args.bind}:{args.port}/", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
