"""The `mqfed` command: one node, and local cluster operations."""

from __future__ import annotations

import argparse
import sys

from sidecar.cli import audit, bench, chaos, cluster, ctl, load, node
from sidecar.cli.options import share_group_options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqfed", description="Several unmodified Mosquitto brokers as one MQTT broker."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    node.add_command(sub)
    cluster.add_commands(sub)
    bench.add_command(sub)
    load.add_command(sub)
    audit.add_command(sub)
    chaos.add_command(sub)
    ctl.add_command(sub)
    share_group_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
