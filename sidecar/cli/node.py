"""`mqfed node --config FILE`: run one node in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import sys

from sidecar.admin.server import AdminServerError
from sidecar.broker.conf import BrokerConfigError
from sidecar.broker.process import BrokerStartError
from sidecar.config import ConfigError, load_config
from sidecar.local.link import LinkError
from sidecar.logs import setup_logging
from sidecar.membership.etcd import MembershipError
from sidecar.observability.http import MetricsServerError
from sidecar.private_files import make_private
from sidecar.tokens import AuthError, configured_token


def add_command(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("node", help="run one node (Mosquitto + plugin + sidecar)",
                            description="Run one mqfed node in the foreground until SIGTERM.")
    parser.add_argument("--config", required=True, help="the node's TOML config file")
    parser.add_argument("--print-mosquitto-conf", action="store_true",
                        help="print the generated Mosquitto config and exit (for running "
                             "Mosquitto yourself with mqtt.manage = false)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.node.layout import NodeError, NodeLayout, render_mosquitto_conf
    from sidecar.node.node import run_node

    make_private()  # every file of the node (and its Mosquitto) 0600, folders 0700
    try:
        config = load_config(args.config)
        setup_logging(config["log"]["level"], config["log"]["format"], config.node_id,
                      config["log"]["debug"])
        if args.print_mosquitto_conf:
            layout = NodeLayout(config.run_dir)
            links = ""
            if config["routing"]["links"]:  # the password peers' links give (from the token)
                from sidecar.routing.links_wiring import link_secret
                links = link_secret(configured_token(config["grpc"], "peer token"))
            print(render_mosquitto_conf(config, layout, layout.prepare(), links), end="")
            layout.prepare_socket_dir()  # Mosquitto, started by you, binds the socket there
            return 0
        return asyncio.run(run_node(config))
    except (ConfigError, BrokerConfigError, NodeError, BrokerStartError, LinkError, AuthError,
            MembershipError, AdminServerError, MetricsServerError) as exc:
        print(f"mqfed node: {exc}", file=sys.stderr)
        return 2
