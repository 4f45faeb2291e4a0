"""`mqfed bench --scale`'s options: phases and cluster sizes as the parser reads them."""

from __future__ import annotations

import pytest

from sidecar.cli import build_parser


def _parse(*args: str):
    return build_parser().parse_args(["bench", "--scale", *args])


def test_the_defaults_run_every_phase_on_3_nodes_at_the_issues_sizes():
    args = _parse()
    assert args.phases == ("bulk", "churn", "clients", "fanout", "join")
    assert args.nodes == (3,)
    assert (args.clients, args.fanout, args.fanout_publishes) == (10_000, 1000, 10)


def test_phases_run_in_their_own_order_whatever_order_they_are_given_in():
    assert _parse("--phases", "fanout, clients").phases == ("clients", "fanout")
    assert _parse("--phases", "join,bulk").phases == ("bulk", "join")


def test_node_counts_are_kept_in_the_order_given():
    assert _parse("--nodes", "3,5,9").nodes == (3, 5, 9)
    assert _parse("--nodes", "9,3").nodes == (9, 3)


@pytest.mark.parametrize("args", [("--phases", "bulk,nope"), ("--phases", ""),
                                  ("--nodes", "1"), ("--nodes", "3,x"), ("--nodes", "99"),
                                  ("--clients", "0"), ("--fanout", "-1")])
def test_bad_values_are_refused(args, capsys):
    with pytest.raises(SystemExit):
        _parse(*args)
    assert "error" in capsys.readouterr().err
