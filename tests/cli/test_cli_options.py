"""`mqfed` command line: the `sidecar.cli` package, and a command group's options accepted
both before and after its subcommand (`mqfed ctl --json status` = `mqfed ctl status --json`)."""

from __future__ import annotations

import argparse
import ast
import importlib
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]

CTL_SUBCOMMANDS = ("status", "nodes", "routes", "subscriptions", "clients", "sessions", "retained",
                   "drain", "undrain", "trace")
# every option of `mqfed ctl` itself, with a value unlike its default
CTL_OPTIONS = {
    "--node": ["10.0.0.9:7999"],
    "--token": ["t0k"],
    "--token-file": ["/nowhere/token"],
    "--tls-ca": ["/nowhere/ca.pem"],
    "--run-dir": ["/nowhere/run"],
    "--timeout": ["2.5"],
    "--json": [],
}
# subcommands with their own `--node ID` (a node filter): there it keeps that meaning
OWN_NODE = {"status", "routes", "subscriptions", "clients", "sessions", "retained"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found[name] = sub
    return found


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _groups(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
            ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser with subcommands, with the words that lead to it."""
    subs = _subcommands(parser)
    if subs:
        yield path, parser
    for name, sub in subs.items():
        yield from _groups(sub, (*path, name))


def _sample(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[-1])]
    if action.type in (int, float):
        return ["7"]
    return ["x"]


def _needed(parser: argparse.ArgumentParser) -> list[str]:
    """The least a subcommand needs to parse: its required options and positionals."""
    argv: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if not action.option_strings:
            argv += _sample(action)
        elif action.required:
            argv += [action.option_strings[0], *_sample(action)]
    for group in parser._mutually_exclusive_groups:
        if group.required:
            action = group._group_actions[0]
            argv += [action.option_strings[0], *_sample(action)]
    return argv


def parse(*argv: str) -> dict:
    return vars(build_parser().parse_args(list(argv)))


def test_the_test_knows_every_ctl_option_and_subcommand() -> None:
    ctl = _subcommands(build_parser())["ctl"]
    assert {s for a in _options(ctl) for s in a.option_strings} == set(CTL_OPTIONS)
    assert tuple(_subcommands(ctl)) == CTL_SUBCOMMANDS


@pytest.mark.parametrize("option", list(CTL_OPTIONS))
@pytest.mark.parametrize("command", CTL_SUBCOMMANDS)
def test_ctl_option_before_or_after_the_subcommand(command: str, option: str) -> None:
    ctl = _subcommands(build_parser())["ctl"]
    needed = _needed(_subcommands(ctl)[command])
    given = [option, *CTL_OPTIONS[option]]
    before = parse("ctl", *given, command, *needed)
    after = parse("ctl", command, *needed, *given)
    default = parse("ctl", command, *needed)
    if option == "--node" and command in OWN_NODE:
        # the subcommand's own --node (node ids to ask about) wins after the subcommand
        assert before["address"] == "10.0.0.9:7999" and before["only"] == []
        assert after["address"] == default["address"] and after["only"] == ["10.0.0.9:7999"]
        return
    assert after == before
    changed = {k for k in before if before[k] != default[k]}
    assert len(changed) == 1, changed
    assert before.keys() == default.keys()


def test_ctl_all_options_before_or_after_every_subcommand() -> None:
    ctl = _subcommands(build_parser())["ctl"]
    for command, sub in _subcommands(ctl).items():
        given = [w for option, value in CTL_OPTIONS.items()
                 if not (option == "--node" and command in OWN_NODE) for w in (option, *value)]
        before = parse("ctl", *given, command, *_needed(sub))
        after = parse("ctl", command, *_needed(sub), *given)
        assert after == before, command
        assert before["json"] is True and before["timeout"] == 2.5 and before["token"] == "t0k"
        assert before["token_file"] == "/nowhere/token" and before["tls_ca"] == "/nowhere/ca.pem"


def test_ctl_defaults_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQFED_CTL_NODE", raising=False)
    monkeypatch.delenv("MQFED_ADMIN_TLS_CA", raising=False)
    for command in ("status", "nodes"):
        ns = parse("ctl", command)
        assert (ns["address"], ns["token"], ns["token_file"], ns["tls_ca"], ns["timeout"],
                ns["json"]) == ("127.0.0.1:7101", None, None, "", 10.0, False)
    monkeypatch.setenv("MQFED_CTL_NODE", "10.1.1.1:1")
    assert parse("ctl", "nodes")["address"] == "10.1.1.1:1"
    assert parse("ctl", "nodes", "--node", "10.2.2.2:2")["address"] == "10.2.2.2:2"


def test_ctl_option_after_the_subcommand_wins() -> None:
    ns = parse("ctl", "--timeout", "1", "--node", "a:1", "--token", "one", "nodes",
               "--timeout", "5", "--node", "b:2", "--token", "two")
    assert (ns["timeout"], ns["address"], ns["token"]) == (5.0, "b:2", "two")
    # given only before: kept (the subcommand's unset copy does not reset it)
    ns = parse("ctl", "--json", "--timeout", "3", "status", "--node", "n1")
    assert (ns["json"], ns["timeout"], ns["only"]) == (True, 3.0, ["n1"])


def test_every_group_accepts_its_options_after_every_subcommand() -> None:
    groups = list(_groups(build_parser()))
    assert ("ctl",) in [path for path, _ in groups]
    for path, group in groups:
        for command, sub in _subcommands(group).items():
            own = {s for a in _options(sub) if a.default is not argparse.SUPPRESS
                   for s in a.option_strings}
            for action in _options(group):
                if own & set(action.option_strings):
                    continue
                given = [action.option_strings[-1], *_sample(action)]
                before = parse(*path, *given, command, *_needed(sub))
                after = parse(*path, command, *_needed(sub), *given)
                assert after == before, (path, command, given)


def _mqfed(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_ctl_json_after_or_before_the_subcommand_end_to_end() -> None:
    after = _mqfed("ctl", "--node", "127.0.0.1:1", "--timeout", "1", "status", "--json")
    before = _mqfed("ctl", "--json", "--node", "127.0.0.1:1", "--timeout", "1", "status")
    assert (after.returncode, after.stdout, after.stderr) == (
        before.returncode, before.stdout, before.stderr)
    assert before.returncode == 3, before.stderr  # UNREACHABLE, not a usage error
    assert "127.0.0.1:1" in before.stderr


def test_python_m_and_the_console_script_entry_point() -> None:
    result = _mqfed("--help")
    assert result.returncode == 0 and "ctl" in result.stdout, result.stderr
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["mqfed"].partition(":")
    main = getattr(importlib.import_module(module), attr)
    assert callable(main)
    with pytest.raises(SystemExit) as exc:
        main(["ctl", "status", "--help"])
    assert exc.value.code == 0


def test_nothing_outside_sidecar_cli_imports_it() -> None:
    offenders = []
    for path in (ROOT / "sidecar").rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("sidecar", "cli") or "_proto" in rel.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "sidecar.cli" or n.startswith("sidecar.cli.") for n in names):
                offenders.append(str(rel))
    assert not offenders
