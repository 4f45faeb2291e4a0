"""Options of a command group accepted after its subcommand too.

`mqfed ctl --json status` and `mqfed ctl status --json` mean the same: every option a group
parser defines is also added to each of its subparsers, with `default=SUPPRESS`, so an
option given after the subcommand overrides the one given before it, and one not given
after it leaves the group's value (or default) alone. A subcommand's own option with the
same option string wins in that subcommand (e.g. `ctl status --node ID` stays the node
filter of `status`, not the group's `--node HOST:PORT`).
"""

from __future__ import annotations

import argparse
import copy

__all__ = ["share_group_options"]


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found: dict[int, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():  # aliases map to the same parser
                found.setdefault(id(subparser), subparser)
    return list(found.values())


def _group_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions
            if action.option_strings
            and not isinstance(action, argparse._HelpAction | argparse._VersionAction)]


def share_group_options(parser: argparse.ArgumentParser) -> None:
    """Accept each group's options after its subcommand, for `parser` and every group below."""
    subparsers = _subparsers(parser)
    options = _group_options(parser)
    for subparser in subparsers:
        shared = [action for action in options
                  if not any(s in subparser._option_string_actions for s in action.option_strings)]
        if shared:
            title = f"options of {parser.prog} (also accepted here)"
            group = subparser.add_argument_group(title)
            for action in shared:
                clone = copy.copy(action)
                clone.default = argparse.SUPPRESS
                clone.required = False
                group._add_action(clone)
        share_group_options(subparser)
