"""The command line every operations tool shares (the exporter, the dashboard).

Each tool serves one namespace over HTTP: it takes ``--target`` (else
``$SIMPLEBROKER_REDIS_URL``, else the ``.broker.toml`` the ``broker`` CLI would
find: the workers' own rule, :mod:`simplebroker_redis.server`), ``--namespace``
and ``--port``, and exits with status 2 when no server is named.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simplebroker_redis.server import Target, choose_server


def tool_parser(prog: str, description: str, default_port: int) -> argparse.ArgumentParser:
    """Return a parser with the options every tool takes (add the tool's own)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--target",
        help="redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL "
        "(default: $SIMPLEBROKER_REDIS_URL, else the .broker.toml of this directory or above, "
        "as the broker CLI finds it)",
    )
    parser.add_argument("--namespace", help="namespace (default: the project's, else the default)")
    parser.add_argument(
        "--port", type=int, default=default_port, help=f"HTTP port (default {default_port})"
    )
    return parser


def find_target(
    target: str | None = None,
    namespace: str | None = None,
    *,
    directory: Path | None = None,
    options: Mapping[str, Any] | None = None,
) -> Target:
    """Return where a tool connects: ``target`` (``--target``), else as the workers find it.

    Raises:
        TargetError: Nothing names a server (the message says to pass
            ``--target``), or the target is malformed.
        InvalidConfigError: A backend option is invalid.

    """
    return choose_server(
        target,
        namespace=namespace,
        options=options,
        source="--target",
        asked="--target redis://HOST:PORT/DB",
        directory=directory,
    )


def tool_target(args: argparse.Namespace) -> Target | None:
    """Return the namespace the options name; None (the error printed) when none is."""
    try:
        return find_target(args.target, args.namespace)
    except (ValueError, TypeError) as exc:  # TargetError, SimpleBroker's InvalidConfigError
        print(f"error: {exc}", file=sys.stderr)
        return None


def log_to_stderr() -> None:
    """Send the tool's log (warnings, restored connections) to stderr with times."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
