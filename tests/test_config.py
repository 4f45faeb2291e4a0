"""Node config: strict validation, environment overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import ConfigError, build_config, load_config, render_toml


def test_defaults_and_required_id():
    cfg = build_config({"node": {"id": "n1"}}, env={})
    assert cfg.node_id == "n1" and cfg.cluster == "mqfed"
    assert cfg["mqtt"]["listen"] == "127.0.0.1:1883"
    assert cfg.run_dir.name == "n1"
    with pytest.raises(ConfigError, match="node.id is required"):
        build_config({}, env={})


@pytest.mark.parametrize("data, message", [
    ({"node": {"id": "n1", "colour": "red"}}, "unknown key node.colour"),
    ({"nodes": {"id": "n1"}}, r"unknown section \[nodes\]"),
    ({"node": {"id": "n1"}, "mqtt": {"listen": "localhost"}}, "mqtt.listen: expected HOST:PORT"),
    ({"node": {"id": "n1"}, "mqtt": {"manage": "yes"}}, "mqtt.manage: expected bool"),
    ({"node": {"id": "bad id!"}}, "node.id: expected 1-63 characters"),
    ({"node": {"id": "n1"}, "membership": {"mode": "zk"}}, "membership.mode: expected one of"),
    ({"node": {"id": "n1"}, "membership": {"mode": "static", "peers": ["n2"]}},
     "membership.peers entry 'n2'"),
    ({"node": {"id": "n1"}, "membership": {"lease_ttl": 0}}, "lease_ttl: expected a number"),
    ({"node": {"id": "n1"}, "grpc": {"token": "t", "token_file": "f"}},
     "grpc.token and grpc.token_file are both set"),
    ({"node": {"id": "n1"}, "grpc": {"tls_cert": "c.pem", "tls_key": "k.pem"}},
     "grpc.tls_cert, grpc.tls_key and grpc.tls_ca go together"),
    ({"node": {"id": "n1"}, "admin": {"tls": True}}, "admin.tls uses the node's certificate"),
    ({"node": {"id": "n1"}, "membership": {"etcd_cert": "c.pem"}},
     "membership.etcd_cert and membership.etcd_key go together"),
    ({"node": {"id": "n1"}, "membership": {"etcd_cert": "c.pem", "etcd_key": "k.pem"}},
     "membership.etcd_cert needs membership.etcd_ca"),
    ({"node": {"id": "n1"}, "membership": {"etcd_user": "u"}},
     "membership.etcd_user and a password"),
    ({"node": {"id": "n1"}, "membership": {"etcd_password": "p"}},
     "membership.etcd_user and a password"),
    ({"node": {"id": "n1"}, "membership": {"etcd_user": "u", "etcd_password": "p",
                                           "etcd_password_file": "f"}},
     "etcd_password and membership.etcd_password_file are both set"),
    ({"node": {"id": "n1"}, "membership": {"etcd": ["10.0.0.5:2379"], "etcd_user": "u",
                                           "etcd_password": "p"}},
     "would send the etcd password in plaintext"),
    ({"node": {"id": "n1"}, "mqtt": {"message_size_limit": 100}},
     "mqtt.message_size_limit: expected 1024 to 41943040 bytes"),
    ({"node": {"id": "n1"}, "mqtt": {"message_size_limit": 70 << 20}},
     "would not fit a 64 MiB peer frame"),
])
def test_bad_values_are_named(data, message):
    with pytest.raises(ConfigError, match=message):
        build_config(data, env={})


def test_environment_overrides_file():
    env = {"MQFED_NODE_ID": "n7", "MQFED_MQTT_MANAGE": "false",
           "MQFED_MEMBERSHIP_ETCD": "127.0.0.1:1, 127.0.0.1:2", "MQFED_CONFIG": "ignored"}
    cfg = build_config({"node": {"id": "n1"}}, env=env)
    assert cfg.node_id == "n7"
    assert cfg["mqtt"]["manage"] is False
    assert cfg["membership"]["etcd"] == ["127.0.0.1:1", "127.0.0.1:2"]


def test_environment_errors_are_named():
    with pytest.raises(ConfigError, match="MQFED_MQTT_LISTNE: unknown key"):
        build_config({"node": {"id": "n1"}}, env={"MQFED_MQTT_LISTNE": "x"})
    with pytest.raises(ConfigError, match="environment MQFED_MQTT_MANAGE: expected true or false"):
        build_config({"node": {"id": "n1"}}, env={"MQFED_MQTT_MANAGE": "maybe"})


def test_file_round_trip_and_relative_paths(tmp_path: Path):
    values = {"node": {"id": "n2", "run_dir": "state"}, "mqtt": {"include": "user.conf"}}
    path = tmp_path / "node.toml"
    path.write_text(render_toml(values))
    cfg = load_config(path, env={})
    assert cfg.run_dir == tmp_path / "state"
    assert cfg["mqtt"]["include"] == str(tmp_path / "user.conf")


def test_unreadable_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[node\nid=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})


def test_a_wildcard_listen_needs_an_advertised_address():
    """Other nodes dial what a node registers; 0.0.0.0 cannot be dialled."""
    with pytest.raises(ConfigError, match=r"grpc.listen '0.0.0.0:7001' binds every interface.*"
                                          r"grpc.advertise"):
        build_config({"node": {"id": "n1"}, "grpc": {"listen": "0.0.0.0:7001"}}, env={})
    with pytest.raises(ConfigError, match=r"admin.advertise '\[::\]:7101' is a wildcard"):
        build_config({"node": {"id": "n1"}, "admin": {"advertise": "[::]:7101"}}, env={})
    cfg = build_config({"node": {"id": "n1"}, "grpc": {"listen": "0.0.0.0:7001"}},
                       env={"MQFED_GRPC_ADVERTISE": "n1.example:7001"})
    assert cfg.advertised("grpc") == "n1.example:7001"
    assert cfg.advertised("admin") == cfg["admin"]["listen"] == "127.0.0.1:7101"


def test_etcd_access_settings(tmp_path: Path):
    """TLS files and the password file are resolved next to the config file; a loopback etcd
    may take a password without TLS; a missing file is named when it is loaded."""
    from sidecar.membership.etcd_access import EtcdAccessError, load_etcd_access

    path = tmp_path / "node.toml"
    path.write_text('[node]\nid = "n1"\n[membership]\netcd_user = "mqfed"\n'
                    'etcd_password_file = "etcd-pw"\netcd_ca = "ca.pem"\n')
    cfg = load_config(path, env={})
    assert cfg["membership"]["etcd_password_file"] == str(tmp_path / "etcd-pw")
    assert cfg["membership"]["etcd_ca"] == str(tmp_path / "ca.pem")
    with pytest.raises(EtcdAccessError, match=f"cannot read membership.etcd_ca {tmp_path}"):
        load_etcd_access(cfg["membership"])
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(EtcdAccessError, match="etcd password file"):
        load_etcd_access(cfg["membership"])
    (tmp_path / "etcd-pw").write_text("pw\n")
    access = load_etcd_access(cfg["membership"])
    assert (access.user, access.password, access.tls) == ("mqfed", "pw", True)
    assert access.describe() == "TLS, user 'mqfed'" and "pw" not in access.describe()
    local = build_config({"node": {"id": "n1"}, "membership": {
        "etcd_user": "u", "etcd_password": "p"}}, env={})
    assert load_etcd_access(local["membership"]).describe() == "plaintext, user 'u'"


def test_capture_is_on_by_default_and_needs_one_forwarding_connection():
    assert build_config({"node": {"id": "n1"}}, env={})["routing"]["capture"] is True
    cfg = build_config({"node": {"id": "n1"}}, env={"MQFED_ROUTING_CAPTURE": "false"})
    assert cfg["routing"]["capture"] is False
    # the default gives way to forwarding shards; asked for, it is refused with them
    shards = {"node": {"id": "n1"}, "routing": {"forward_shards": 2}}
    assert build_config(shards, env={})["routing"]["capture"] is False
    with pytest.raises(ConfigError, match="routing.capture needs routing.forward_shards 1"):
        build_config(shards, env={"MQFED_ROUTING_CAPTURE": "true"})
    with pytest.raises(ConfigError, match="routing.capture needs routing.forward_shards 1"):
        build_config({"node": {"id": "n1"}, "routing": {"capture": True, "forward_shards": 2}},
                     env={})


def test_links_are_off_by_default_and_need_capture_and_a_peer_token():
    assert build_config({"node": {"id": "n1"}}, env={})["routing"]["links"] is False
    token = {"node": {"id": "n1"}, "grpc": {"token": "t" * 32}}
    assert build_config(token, env={"MQFED_ROUTING_LINKS": "true"})["routing"]["links"] is True
    with pytest.raises(ConfigError, match="routing.links needs a peer token"):
        build_config({"node": {"id": "n1"}}, env={"MQFED_ROUTING_LINKS": "true"})
    with pytest.raises(ConfigError, match="routing.links needs routing.capture"):
        build_config(token, env={"MQFED_ROUTING_LINKS": "true", "MQFED_ROUTING_CAPTURE": "false"})
