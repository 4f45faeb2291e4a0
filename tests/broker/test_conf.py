"""Generated Mosquitto config: plugin first, forced settings, user settings preserved."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.broker.conf import (
    DEFAULT_MESSAGE_SIZE_LIMIT,
    HEADERS_MAX,
    MAX_MESSAGE_SIZE_LIMIT,
    BrokerConfig,
    BrokerConfigError,
    max_packet_size_for,
    read_user_settings,
    render,
)
from sidecar.local.protocol import sidecar_client_id


def _cfg(**kw) -> BrokerConfig:
    base = dict(node_id="n1", plugin_path=Path("/p/mqfed_plugin.so"),
                socket_path=Path("/r/mosquitto.sock"), secret="s3", listen="127.0.0.1:1884")
    base.update(kw)
    return BrokerConfig(**base)


def test_defaults_plugin_first_and_grant():
    lines = render(_cfg()).splitlines()
    directives = [line for line in lines if line and not line.startswith("#")]
    assert directives[:3] == ["per_listener_settings false", "persistence false",
                              "plugin /p/mqfed_plugin.so"]
    assert "plugin_opt_auth grant" in lines and "plugin_opt_acl grant" in lines
    assert "allow_anonymous true" in lines
    assert lines[-2:] == ["listener 0 /r/mosquitto.sock", "listener 1884 127.0.0.1"]


def test_user_settings_kept_and_providers_detected(tmp_path: Path):
    user = tmp_path / "user.conf"
    user.write_text("password_file /etc/p\nallow_anonymous false\nlistener 8883\n"
                    "certfile /c.pem\n# note\n")
    settings = read_user_settings(user)
    text = render(_cfg(user=settings, include_path=user))
    assert "plugin_opt_auth defer" in text and "plugin_opt_acl grant" in text
    assert "allow_anonymous true" not in text
    assert "listener 8883\ncertfile /c.pem" in text
    # our plugin comes before any user plugin
    assert text.index("plugin /p/mqfed_plugin.so") < text.index("password_file")


def test_acl_and_other_plugins_defer(tmp_path: Path):
    user = tmp_path / "user.conf"
    user.write_text("plugin /usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so\n"
                    "plugin_opt_config_file /d.json\n")
    text = render(_cfg(user=read_user_settings(user), include_path=user))
    assert "plugin_opt_auth defer" in text and "plugin_opt_acl defer" in text
    acl = tmp_path / "acl.conf"
    acl.write_text("acl_file /etc/acl\n")
    text = render(_cfg(user=read_user_settings(acl), include_path=acl))
    assert "plugin_opt_auth grant" in text and "plugin_opt_acl defer" in text
    text = render(_cfg(user=read_user_settings(acl), include_path=acl, external_acl="no"))
    assert "plugin_opt_acl grant" in text


@pytest.mark.parametrize("line, message", [
    ("per_listener_settings true", "per_listener_settings false"),
    ("persistence true", "persistence false"),
    ("include_dir /etc/mosquitto/conf.d", "include_dir"),
    ("plugin /opt/mqfed_plugin.so", "loads its own plugin"),
    ("message_size_limit 1000", "set mqtt.message_size_limit"),
    ("max_packet_size 1000", "set mqtt.message_size_limit"),
])
def test_conflicting_user_settings_refused(tmp_path: Path, line: str, message: str):
    user = tmp_path / "user.conf"
    user.write_text(f"# header\n{line}\n")
    with pytest.raises(BrokerConfigError, match=f"user.conf:2: .*{message}"):
        read_user_settings(user)


def test_missing_include(tmp_path: Path):
    with pytest.raises(BrokerConfigError, match="cannot read mqtt.include"):
        read_user_settings(tmp_path / "nope.conf")


def test_queue_limit_raised_unless_the_user_sets_one(tmp_path: Path):
    assert "max_queued_messages 10000" in render(_cfg()).splitlines()
    user = tmp_path / "user.conf"
    user.write_text("max_queued_messages 500\n")
    lines = render(_cfg(user=read_user_settings(user), include_path=user)).splitlines()
    assert "max_queued_messages 500" in lines and "max_queued_messages 10000" not in lines


def test_the_plugin_knows_max_queued_messages(tmp_path: Path):
    """inject.c leaves a slow subscriber out of its replies' `queued` near this bound."""
    assert "plugin_opt_max_queued_messages 10000" in render(_cfg()).splitlines()
    user = tmp_path / "user.conf"
    user.write_text("max_queued_messages 500\n")
    lines = render(_cfg(user=read_user_settings(user), include_path=user)).splitlines()
    assert "plugin_opt_max_queued_messages 500" in lines


def test_size_limit_identity_and_private_socket_reach_the_plugin():
    lines = render(_cfg(sidecar_id=sidecar_client_id("s3"))).splitlines()
    assert f"plugin_opt_message_size_limit {DEFAULT_MESSAGE_SIZE_LIMIT}" in lines
    assert f"max_packet_size {max_packet_size_for(DEFAULT_MESSAGE_SIZE_LIMIT)}" in lines
    assert "plugin_opt_sidecar_socket /r/mosquitto.sock" in lines
    assert f"plugin_opt_sidecar_id {sidecar_client_id('s3')}" in lines


def test_packet_limit_leaves_room_for_the_sidecar_and_fits_a_peer_frame():
    for limit in (1024, DEFAULT_MESSAGE_SIZE_LIMIT, MAX_MESSAGE_SIZE_LIMIT):
        packet = max_packet_size_for(limit)
        # the sidecar's deliver of the largest message: base64 payload, escaped headers
        assert packet >= -(-limit * 4 // 3) + 6 * HEADERS_MAX
        assert packet + (1 << 20) < 64 << 20  # with a 1 MiB batch beside it


def test_sidecar_id_is_derived_from_the_secret():
    one, two = sidecar_client_id("secret-1"), sidecar_client_id("secret-2")
    assert one == sidecar_client_id("secret-1") and one != two
    assert one.startswith("mqfed-sidecar-") and len(one) == len("mqfed-sidecar-") + 16


def test_the_capture_socket_is_written_only_when_set():
    """routing.capture: `mqfed node` names the sidecar's capture socket to the plugin."""
    assert not any(line.startswith("plugin_opt_capture_socket")
                   for line in render(_cfg()).splitlines())
    lines = render(_cfg(capture_socket=Path("/r/capture.sock"))).splitlines()
    assert "plugin_opt_capture_socket /r/capture.sock" in lines


def test_the_link_secret_is_written_only_when_set():
    """routing.links: peers' plugin links log in with this password."""
    assert not any(line.startswith("plugin_opt_link_secret")
                   for line in render(_cfg()).splitlines())
    assert "plugin_opt_link_secret abcd" in render(_cfg(link_secret="abcd")).splitlines()
