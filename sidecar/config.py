"""Node configuration: a TOML file with environment overrides, validated strictly.

Every key has a type and a default; an unknown section or key, or a value of the wrong
type, is refused with a `ConfigError` naming it. Environment variables
`MQFED_<SECTION>_<KEY>` (upper case) override the file; lists are comma-separated.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.broker.conf import DEFAULT_MESSAGE_SIZE_LIMIT, MAX_MESSAGE_SIZE_LIMIT
from sidecar.local.shards import MAX_SHARDS


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and what is expected."""


NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT with a port from 1 to 65535")
    return value


def _optional_address(value: str) -> str:
    return value and _address(value)


def _node_id(value: str) -> str:
    if value and not NODE_ID_RE.match(value):
        raise ValueError("expected 1-63 characters of letters, digits, '_', '.', '-'")
    return value


def _one_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return check


def _tristate(value: str) -> str:
    return _one_of("auto", "yes", "no")(value)


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError("expected a number above 0")
    return value


def _replicas(value: int | str) -> int | str:
    """A count of nodes >= 1, or "all"."""
    replica_count(value)
    return value


def replica_count(value: int | str) -> int:
    """`sessions.replicas` as a number (0: all nodes); ValueError if it is neither."""
    if value == "all":
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError('expected a number of nodes (1 or more) or "all"')


def _at_least(minimum: int) -> Callable[[int], int]:
    def check(value: int) -> int:
        if value < minimum:
            raise ValueError(f"expected at least {minimum}")
        return value

    return check


def _message_size_limit(value: int) -> int:
    if not 1024 <= value <= MAX_MESSAGE_SIZE_LIMIT:
        raise ValueError(f"expected 1024 to {MAX_MESSAGE_SIZE_LIMIT} bytes"
                         f" ({MAX_MESSAGE_SIZE_LIMIT >> 20} MiB): a larger message would not fit"
                         " a 64 MiB peer frame once the sidecar base64-encodes it for Mosquitto")
    return value


def _non_negative(value: int) -> int:
    if value < 0:
        raise ValueError("expected 0 or a number above 0")
    return value



def _between(low: float, high: float) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not low <= value <= high:
            raise ValueError(f"expected {low:g} to {high:g}")
        return value

    return check


TOMBSTONE_GRACE = 86_400.0
"""Default of `retained.tombstone_grace`: seconds a tombstone (or an expired message) is kept
before every node forgets it. A node cut off from the cluster for longer may bring the deleted
value back when it returns."""

@dataclass(frozen=True)
class Key:
    type: type
    default: Any
    check: Callable[[Any], Any] | None = None
    help: str = ""


SCHEMA: dict[str, dict[str, Key]] = {
    "node": {
        "id": Key(str, "", _node_id, "this node's id, unique in the cluster"),
        "cluster": Key(str, "mqfed", _node_id, "cluster id; peers of another cluster are refused"),
        "run_dir": Key(str, "", None, "state, sockets, logs (default: run/<id> by the file)"),
    },
    "mqtt": {
        "listen": Key(str, "127.0.0.1:1883", _optional_address, "client listener, '' for none"),
        "include": Key(str, "", None, "your own Mosquitto settings (auth, ACL, TLS listeners)"),
        "mosquitto": Key(str, "/usr/sbin/mosquitto", None, "the Mosquitto binary"),
        "manage": Key(bool, True, None, "start and supervise Mosquitto (false: attach)"),
        "plugin": Key(str, "", None, "path of mqfed_plugin.so (default: the built one)"),
        "external_auth": Key(str, "auto", _tristate, "another authentication provider exists"),
        "external_acl": Key(str, "auto", _tristate, "another ACL provider exists"),
        "link_timeout": Key(float, 10.0, _positive, "seconds to wait for the local link"),
        "message_size_limit": Key(int, DEFAULT_MESSAGE_SIZE_LIMIT, _message_size_limit,
                                  "largest payload a client may publish, in bytes (the same"
                                  " on every node); larger ones are refused at the edge"),
        "journal": Key(bool, True, None, "journal QoS > 0 messages peers want until peers"
                       " have them, so that a node killed before forwarding them replays them"
                       " when it starts again (an append per message, no fsync)"),
    },
    "grpc": {
        "listen": Key(str, "127.0.0.1:7001", _address, "peer gRPC listener"),
        "advertise": Key(str, "", _optional_address, "HOST:PORT peers dial (default: listen;"
                         " required when listen is a wildcard such as 0.0.0.0)"),
        "token": Key(str, "", None, "shared secret every peer stream must present (the same"
                     " on every node; empty: peers are not authenticated)"),
        "token_file": Key(str, "", None, "file holding the peer token (instead of token)"),
        "tls_cert": Key(str, "", None, "PEM certificate (chain) of this node for peer streams;"
                        " with tls_key and tls_ca: mutual TLS"),
        "tls_key": Key(str, "", None, "PEM private key of tls_cert"),
        "tls_ca": Key(str, "", None, "PEM CA that signed every node's tls_cert"),
        "max_message_bytes": Key(int, 64 << 20, _at_least(64 << 10), "largest peer frame"
                                 " (bytes; the same on every node): a message above it is"
                                 " not forwarded; keep Mosquitto's message_size_limit below"),
    },
    "admin": {
        "listen": Key(str, "127.0.0.1:7101", _address, "admin gRPC listener"),
        "advertise": Key(str, "", _optional_address, "HOST:PORT other nodes and `mqfed ctl`"
                         " fan-out dial (default: listen; required for a wildcard listen)"),
        "metrics": Key(str, "127.0.0.1:9101", _optional_address,
                       "Prometheus /metrics, /healthz and /readyz listener ('' for none)"),
        "token": Key(str, "", None, "bearer token admin calls must carry"),
        "token_file": Key(str, "", None, "file holding the admin token (instead of token)"),
        "dev_mode": Key(bool, False, None, "accept admin calls without a token (loopback "
                        "admin.listen only; for development)"),
        "tls": Key(bool, False, None, "serve admin calls over TLS with the grpc.tls_* "
                   "certificate (`mqfed ctl --tls-ca`)"),
        "status_page_open_on_loopback": Key(
            bool, True, None, "the status page at admin.metrics' / answers without the "
            "admin token when admin.metrics is on loopback (a development cluster); on any "
            "other address it always needs the token"),
    },
    "membership": {
        "mode": Key(str, "etcd", _one_of("etcd", "static"), "etcd or a static peer list"),
        "etcd": Key(list, ["127.0.0.1:2379"], None, "etcd endpoints HOST:PORT"),
        "peers": Key(list, [], None, "static peers as ID@HOST:PORT (gRPC)"),
        "lease_ttl": Key(int, 5, _positive, "etcd lease TTL in seconds"),
        "etcd_ca": Key(str, "", None, "PEM CA that signed etcd's server certificate: talk to"
                       " etcd over TLS (the endpoints must be names the certificate holds)"),
        "etcd_cert": Key(str, "", None, "PEM client certificate for etcd (--client-cert-auth);"
                         " with etcd_key and etcd_ca"),
        "etcd_key": Key(str, "", None, "PEM private key of etcd_cert"),
        "etcd_user": Key(str, "", None, "etcd user (etcd authentication enabled); with"
                         " etcd_password or etcd_password_file"),
        "etcd_password": Key(str, "", None, "password of etcd_user"),
        "etcd_password_file": Key(str, "", None, "file holding the password of etcd_user"),
    },
    "retained": {
        "tombstone_grace": Key(float, TOMBSTONE_GRACE, _positive, "seconds deleted and expired"
                               " retained messages are remembered (longer than any outage or"
                               " partition a node may come back from)"),
    },
    "sessions": {
        "replicas": Key(int | str, 2, _replicas, "nodes that hold the messages queued for an"
                        " offline persistent session, its owner included (1: the owner only;"
                        " \"all\": every node)"),
        "down_grace": Key(float, 1.0, _positive, "seconds a node's peer stream must be down"
                          " before its sessions' replicas take over"),
    },
    "drain": {
        "on_stop": Key(float, 20.0, _between(0, 3600), "seconds a node stopped by SIGTERM first"
                       " drains like `mqfed ctl drain` (clients and their sessions move to the"
                       " other nodes) while another node serves; then it leaves (0: leave"
                       " at once)"),
    },
    "wills": {
        "grace": Key(float, 3.0, _positive, "seconds a node's peer streams must have been down,"
                     " after its etcd lease expired, before it is confirmed dead and one"
                     " survivor publishes its clients' wills"),
    },
    "routing": {
        "forward_shards": Key(int, 1, _between(1, MAX_SHARDS), "connections that hold the"
                              " forwarding subscriptions (peers' interest) on the local"
                              " Mosquitto, each filter on one by a hash: Mosquitto's cost"
                              " per subscription grows with those its client holds (1: the"
                              " one forwarding connection; a change starts them afresh)"),
        "inject_batches": Key(bool, True, None, "re-inject each frame of messages from a peer"
                              " as batches the plugin publishes inside Mosquitto, sized to the"
                              " room in the subscribers' queues, a slow subscriber's left out"
                              " (issue 25, docs/architecture.md \"The C bridge\"); false: one"
                              " PUBLISH per message on the forwarding connection"),
        "records": Key(bool, True, None, "send peers that take them plain messages as the"
                       " records their plugin re-injects (MessageBatch.records: nothing"
                       " decoded or encoded again on their side; issue 25); false: as"
                       " envelopes"),
        "capture": Key(bool, True, None, "the plugin hands this node's local publishes that"
                       " peers want to the sidecar as records over a unix socket instead of"
                       " MQTT copies on the forwarding connection, naming their publisher"
                       " (No Local on other nodes; issue 25 slice 2, docs/architecture.md"
                       " \"The C bridge\"); needs forward_shards 1 (left out by default"
                       " with more shards)"),
        "links": Key(bool, False, None, "EXPERIMENTAL (issue 25): the plugin writes the copies"
                     " peers want straight to their Mosquittos over its own MQTT links, no"
                     " sidecar per message (docs/architecture.md \"The C bridge\"). Not yet"
                     " safe: a session moving under traffic, a peer down or a node crash may"
                     " lose or reorder messages; needs routing.capture, a peer token, and"
                     " every node with it on (else links carry nothing)"),
    },
    "catchup": {
        "window": Key(float, 5.0, _between(0, 600), "seconds this node keeps its recent publishes"
                      " so a peer's new subscription gets what was published here between its"
                      " SUBACK and the moment this node learnt of it (0: off)"),
        "max_bytes": Key(int, 16 << 20, _between(1024, 2**32 - 1), "bytes of recent"
                         " publishes kept for that (in Mosquitto's plugin, and as much in the"
                         " sidecar)"),
        "margin": Key(float, 0.05, _between(0, 60), "seconds of clock skew allowed between"
                      " nodes: a catch-up starts this long before the subscribe time (a"
                      " message published up to this long before a subscription may reach it)"),
    },
    "overload": {
        "shed_above": Key(int, 0, _non_negative, "forwarding copies not yet acknowledged by"
                          " peers at which publishers of QoS > 0 messages peers want are"
                          " disconnected before their message is acked (0: a quarter of the"
                          " forwarding client's Receive Maximum)"),
        "backlog_max": Key(int, 0, _non_negative, "copies Mosquitto may hold for the"
                           " forwarding client (taken and unacknowledged, or not taken yet:"
                           " the plugin's estimate) before the plugin sheds publishers on its"
                           " own, also while this sidecar is down (0: half of"
                           " max_queued_messages)"),
    },
    "log": {
        "level": Key(str, "warning", _one_of("debug", "info", "warning", "error"), "log level"),
        "format": Key(str, "json", _one_of("json", "text"), "log line format"),
        "debug": Key(list, [], None, "loggers that log at debug whatever the level, e.g."
                     " [\"mqfed.sessions\"] (every session operation, per client)"),
    },
}


@dataclass(frozen=True)
class NodeConfig:
    """The validated configuration of one node: `values[section][key]`."""

    values: Mapping[str, Mapping[str, Any]]
    source: Path | None = None
    run_dir: Path = field(default=Path("."))

    def __getitem__(self, section: str) -> Mapping[str, Any]:
        return self.values[section]

    @property
    def node_id(self) -> str:
        return self.values["node"]["id"]

    @property
    def cluster(self) -> str:
        return self.values["node"]["cluster"]

    def advertised(self, section: str) -> str:
        """The address other nodes dial for `section` ("grpc" or "admin"): its `advertise`
        key, else its `listen` (never a wildcard: `build_config` refuses that)."""
        return self.values[section]["advertise"] or self.values[section]["listen"]


def _coerce(where: str, key: Key, value: Any) -> Any:
    if key.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if key.type is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    elif not isinstance(value, key.type) or (key.type is int and isinstance(value, bool)):
        expected = getattr(key.type, "__name__", str(key.type).replace(" | ", " or "))
        raise ConfigError(f"{where}: expected {expected}, got {value!r}")
    if key.check is not None:
        try:
            value = key.check(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc} (got {value!r})") from None
    return value


def _from_env(text: str, key: Key, where: str) -> Any:
    if key.type is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true or false, got {text!r}")
    if key.type is list:
        return [part.strip() for part in text.split(",") if part.strip()]
    if key.type in (int, float):
        try:
            return key.type(text)
        except ValueError:
            raise ConfigError(f"{where}: expected {key.type.__name__}, got {text!r}") from None
    return text


def _env_overrides(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, text in env.items():
        if not name.startswith("MQFED_"):
            continue
        rest = name[len("MQFED_"):].lower()
        section = next((s for s in SCHEMA if rest.startswith(s + "_")), None)
        if section is None:
            continue  # other MQFED_ variables are not configuration keys
        key_name = rest[len(section) + 1:]
        if key_name not in SCHEMA[section]:
            known = ", ".join(f"MQFED_{section.upper()}_{k.upper()}" for k in SCHEMA[section])
            raise ConfigError(f"environment {name}: unknown key; known: {known}")
        out.setdefault(section, {})[key_name] = _from_env(text, SCHEMA[section][key_name],
                                                          f"environment {name}")
    return out


def build_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None,
                 source: Path | None = None) -> NodeConfig:
    """Validate `data` (parsed TOML) plus environment overrides into a NodeConfig."""
    where_file = str(source) if source else "config"
    for section, body in data.items():
        if section not in SCHEMA:
            raise ConfigError(f"{where_file}: unknown section [{section}]; known: "
                              + ", ".join(SCHEMA))
        if not isinstance(body, Mapping):
            raise ConfigError(f"{where_file}: [{section}] must be a table")
        for key in body:
            if key not in SCHEMA[section]:
                raise ConfigError(f"{where_file}: unknown key {section}.{key}; known: "
                                  + ", ".join(SCHEMA[section]))
    overrides = _env_overrides(env if env is not None else os.environ)
    values: dict[str, dict[str, Any]] = {}
    for section, keys in SCHEMA.items():
        values[section] = {}
        for name, key in keys.items():
            where = f"{where_file}: {section}.{name}"
            if name in overrides.get(section, {}):
                raw = overrides[section][name]
                where = f"environment MQFED_{section.upper()}_{name.upper()}"
            else:
                raw = data.get(section, {}).get(name, key.default)
            values[section][name] = _coerce(where, key, raw)
    if not values["node"]["id"]:
        raise ConfigError(f"{where_file}: node.id is required (or MQFED_NODE_ID)")
    base = source.parent if source else Path.cwd()
    run_dir = Path(values["node"]["run_dir"] or f"run/{values['node']['id']}")
    run_dir = run_dir if run_dir.is_absolute() else (base / run_dir)
    _check_admin(values["admin"], where_file)
    for section in ("grpc", "admin"):
        _check_advertised(section, values[section], where_file)
    if values["grpc"]["token"] and values["grpc"]["token_file"]:
        raise ConfigError(f"{where_file}: grpc.token and grpc.token_file are both set; set one")
    tls = [values["grpc"][k] for k in ("tls_cert", "tls_key", "tls_ca")]
    if any(tls) and not all(tls):
        raise ConfigError(f"{where_file}: grpc.tls_cert, grpc.tls_key and grpc.tls_ca go "
                          "together: set all three (mutual TLS) or none")
    if values["admin"]["tls"] and not all(tls):
        raise ConfigError(f"{where_file}: admin.tls uses the node's certificate: set "
                          "grpc.tls_cert, grpc.tls_key and grpc.tls_ca too")
    _check_etcd_access(values["membership"], where_file)
    if values["routing"]["capture"] and values["routing"]["forward_shards"] > 1:
        if "capture" not in overrides.get("routing", {}) \
                and "capture" not in data.get("routing", {}):
            values["routing"]["capture"] = False  # the default gives way to the shards
        else:
            raise ConfigError(f"{where_file}: routing.capture needs routing.forward_shards 1"
                              " (a message a shard's and .fwd's filters match would reach the"
                              " sidecar twice)")
    if values["routing"]["links"] and not values["routing"]["capture"]:
        raise ConfigError(f"{where_file}: routing.links needs routing.capture (links carry what"
                          " the plugin captures)")
    if values["routing"]["links"] and not (values["grpc"]["token"]
                                           or values["grpc"]["token_file"]):
        raise ConfigError(f"{where_file}: routing.links needs a peer token (grpc.token or"
                          " grpc.token_file): the links' password is derived from it")
    for section, name in (("mqtt", "include"), ("mqtt", "plugin"), ("admin", "token_file"),
                          ("grpc", "token_file"), ("grpc", "tls_cert"), ("grpc", "tls_key"),
                          ("grpc", "tls_ca"), ("membership", "etcd_ca"),
                          ("membership", "etcd_cert"), ("membership", "etcd_key"),
                          ("membership", "etcd_password_file")):
        path = values[section][name]
        if path and not Path(path).is_absolute():
            values[section][name] = str((base / path).resolve())
    if values["membership"]["mode"] == "static":
        for peer in values["membership"]["peers"]:
            node, sep, addr = peer.partition("@")
            try:
                _node_id(node)
                _address(addr)
            except ValueError as exc:
                raise ConfigError(f"{where_file}: membership.peers entry {peer!r}: expected "
                                  f"ID@HOST:PORT ({exc})") from None
    return NodeConfig(values=values, source=source, run_dir=run_dir.resolve())


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT `address` listens on loopback only."""
    host = address.rpartition(":")[0]
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _check_admin(admin: Mapping[str, Any], where: str) -> None:
    if admin["token"] and admin["token_file"]:
        raise ConfigError(f"{where}: admin.token and admin.token_file are both set; set one")
    if admin["dev_mode"] and not is_loopback(admin["listen"]):
        raise ConfigError(f"{where}: admin.dev_mode accepts admin calls without a token and is "
                          f"allowed only on a loopback admin.listen (127.0.0.1, ::1, "
                          f"localhost), got {admin['listen']!r}")


def _check_etcd_access(membership: Mapping[str, Any], where: str) -> None:
    """Which etcd TLS and credential keys go together."""
    m = membership
    if bool(m["etcd_cert"]) != bool(m["etcd_key"]):
        raise ConfigError(f"{where}: membership.etcd_cert and membership.etcd_key go together:"
                          " set both (a client certificate for etcd) or neither")
    if m["etcd_cert"] and not m["etcd_ca"]:
        raise ConfigError(f"{where}: membership.etcd_cert needs membership.etcd_ca (the CA of"
                          " etcd's server certificate): a client certificate is sent over TLS")
    if m["etcd_password"] and m["etcd_password_file"]:
        raise ConfigError(f"{where}: membership.etcd_password and membership.etcd_password_file"
                          " are both set; set one")
    has_password = bool(m["etcd_password"] or m["etcd_password_file"])
    if bool(m["etcd_user"]) != has_password:
        raise ConfigError(f"{where}: membership.etcd_user and a password (membership."
                          "etcd_password or etcd_password_file) go together: set both or neither")
    if m["etcd_user"] and not m["etcd_ca"] and not all(
            is_loopback(ep.split("://", 1)[-1]) for ep in m["etcd"]):
        raise ConfigError(f"{where}: membership.etcd_user without membership.etcd_ca would send"
                          " the etcd password in plaintext to a non-loopback etcd; set"
                          " membership.etcd_ca (etcd with TLS)")


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "*", "")


def _check_advertised(section: str, body: Mapping[str, Any], where: str) -> None:
    """Other nodes dial what a node registers: a wildcard cannot be dialled."""
    if body["advertise"]:
        if body["advertise"].rpartition(":")[0] in WILDCARD_HOSTS:
            raise ConfigError(f"{where}: {section}.advertise {body['advertise']!r} is a wildcard;"
                              f" set the host name or IP address other nodes reach this one at")
        return
    if body["listen"].rpartition(":")[0] in WILDCARD_HOSTS:
        raise ConfigError(
            f"{where}: {section}.listen {body['listen']!r} binds every interface, but other"
            f" nodes need an address to dial: set {section}.advertise = \"HOST:PORT\""
            f" (or MQFED_{section.upper()}_ADVERTISE) to this node's reachable name or IP")


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> NodeConfig:
    """Read and validate a node's TOML config file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return build_config(data, env, source=path.resolve())


def render_toml(values: Mapping[str, Mapping[str, Any]]) -> str:
    """Write a config as TOML (used by the cluster launcher); only known keys."""
    lines: list[str] = []
    for section, body in values.items():
        if section not in SCHEMA:
            raise ConfigError(f"unknown section [{section}]")
        lines.append(f"[{section}]")
        for key, value in body.items():
            if key not in SCHEMA[section]:
                raise ConfigError(f"unknown key {section}.{key}")
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
