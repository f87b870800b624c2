"""The command line every operations tool shares (the exporter, the dashboard).

Each tool serves one namespace over HTTP: it takes ``--target`` (else the
``.broker.toml`` the ``broker`` CLI would find), ``--namespace`` and
``--port``, and exits with status 2 when no server is named.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .observe import Target, TargetError, find_target


def tool_parser(prog: str, description: str, default_port: int) -> argparse.ArgumentParser:
    """Return a parser with the options every tool takes (add the tool's own)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--target",
        help="redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL "
        "(default: the .broker.toml of this directory or above, as the broker CLI finds it)",
    )
    parser.add_argument("--namespace", help="namespace (default: the project's, else the default)")
    parser.add_argument(
        "--port", type=int, default=default_port, help=f"HTTP port (default {default_port})"
    )
    return parser


def tool_target(args: argparse.Namespace) -> Target | None:
    """Return the namespace the options name; None (the error printed) when none is."""
    try:
        return find_target(args.target, args.namespace)
    except (TargetError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def log_to_stderr() -> None:
    """Send the tool's log (warnings, restored connections) to stderr with times."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
