"""Load the Functions library onto a server, as an administrator: an operations tool.

``python -m simplebroker_redis.scripts {load URL | print}`` (the command keeps
the name of the package that assembles the library). An administrator
loads the library once per server (or cluster node), so namespace users need
only ``+fcall`` (README, "Least-privilege ACL"); ``print`` writes it
for ``redis-cli -x FUNCTION LOAD REPLACE``.
"""

from __future__ import annotations

import argparse

import redis

from simplebroker_redis.scripts import library
from simplebroker_redis.targets import InvalidTarget, parse_target, redact_target


def main(argv: list[str] | None = None) -> int:
    """``python -m simplebroker_redis.scripts {load URL | print}``: install the library.

    ``load`` prints the name of the library it loaded.
    """
    parser = argparse.ArgumentParser(prog="python -m simplebroker_redis.scripts")
    commands = parser.add_subparsers(dest="command", required=True)
    load = commands.add_parser("load", help="FUNCTION LOAD REPLACE the library at URL")
    load.add_argument("url", help="redis://[user:password@]host:port/db of an admin user")
    commands.add_parser("print", help="print the library's source")
    args = parser.parse_args(argv)
    if args.command == "print":
        print(library(), end="")
        return 0
    try:
        spec = parse_target(args.url)
    except InvalidTarget as exc:
        parser.error(str(exc))
    if spec.kind != "single":
        parser.error("load the library on each primary, with its own redis:// URL")
    client = redis.Redis.from_url(spec.url, decode_responses=True)
    try:
        print(client.function_load(library(), replace=True))  # the library's name
    except redis.RedisError as exc:  # redis-py's messages name no password
        where = redact_target(args.url)
        parser.exit(1, f"{parser.prog}: error: {where}: {type(exc).__name__}: {exc}\n")
    finally:
        client.close()
    return 0
