"""The `mqfed` command: one node, and local cluster operations."""

from __future__ import annotations

import argparse
import sys

from sidecar import (
    audit_command,
    bench_command,
    cluster_commands,
    ctl_command,
    node_command,
)
from sidecar.bench import load_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqfed", description="Several unmodified Mosquitto brokers as one MQTT broker."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    node_command.add_command(sub)
    cluster_commands.add_commands(sub)
    bench_command.add_command(sub)
    load_command.add_command(sub)
    audit_command.add_command(sub)
    ctl_command.add_command(sub)
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
