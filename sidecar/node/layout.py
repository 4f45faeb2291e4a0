"""Where a node keeps its files, and the Mosquitto config it writes (adapter helpers)."""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import shutil
import time
from pathlib import Path

from sidecar.broker import conf as broker_conf
from sidecar.config import NodeConfig
from sidecar.local.protocol import sidecar_client_id
from sidecar.private_files import make_traversable

REPO_ROOT = Path(__file__).resolve().parents[2]
PLUGIN_CANDIDATES = (
    REPO_ROOT / "deploy" / "mosquitto-plugin" / "build" / "mqfed_plugin.so",
    Path("/usr/lib/mqfed/mqfed_plugin.so"),
)


class NodeError(RuntimeError):
    """The node cannot start; the message says what to do."""


def find_plugin(configured: str) -> Path:
    """The plugin shared object to load, or a NodeError saying how to build it."""
    candidates = (Path(configured),) if configured else PLUGIN_CANDIDATES
    for path in candidates:
        if path.is_file():
            return path
    raise NodeError(f"mqfed plugin not found at {', '.join(map(str, candidates))}: "
                    "build it with `make install` (or `make -C deploy/mosquitto-plugin`) "
                    "or set mqtt.plugin")


SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; keep a margin
SOCKET_FALLBACK_ROOT = Path("/tmp/mqfed-sockets")


def _mosquitto_user() -> pwd.struct_passwd | None:
    """The user Mosquitto drops to when started as root (None when not root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("mosquitto")
    except KeyError:
        return None


def _others_can_traverse(path: Path) -> bool:
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents] if p.exists())


class NodeLayout:
    """Where a node keeps its files inside its run dir.

    The private socket lives in `<run_dir>/mosquitto/` unless that path is too long for a unix
    socket or (as root) not reachable by the `mosquitto` user Mosquitto drops to; then it lives
    in a folder under /tmp/mqfed-sockets/ named by a hash of the run dir (stable across
    restarts, so a restarted sidecar finds its Mosquitto).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.conf_path = run_dir / "mosquitto.conf"
        self.secret_path = run_dir / "secret"
        self.state_path = run_dir / "state.json"
        self.socket_dir = run_dir / "mosquitto"
        user = _mosquitto_user()
        reachable = user is None or _others_can_traverse(run_dir)
        if not reachable or len(str(self.socket_dir / "mosquitto.sock")) > SOCKET_PATH_MAX:
            digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:16]
            self.socket_dir = SOCKET_FALLBACK_ROOT / digest
        self.socket_path = self.socket_dir / "mosquitto.sock"
        # where the sidecar listens for the plugin's captured records (routing.capture): in
        # the private folder, as whoever connects there can pose as the plugin
        self.capture_socket = self.socket_dir / "capture.sock"

    def prepare_socket_dir(self) -> None:
        """Create the socket's folder, writable by the user Mosquitto drops to."""
        if self.socket_dir.parent == SOCKET_FALLBACK_ROOT:
            make_traversable(SOCKET_FALLBACK_ROOT)
        self.socket_dir.mkdir(exist_ok=True)
        user = _mosquitto_user()
        if user is not None:  # Mosquitto drops to this user before binding the socket
            os.chown(self.socket_dir, user.pw_uid, user.pw_gid)
            self.socket_dir.chmod(0o700)  # the sidecar, root here, needs no permission

    def prepare(self) -> str:
        """Create the run dir; return the node's secret, created on first start."""
        make_traversable(self.run_dir)  # Mosquitto's user may need to reach its socket
        if not self.secret_path.exists():
            fd = os.open(self.secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(24))
        return self.secret_path.read_text().strip()

    def next_incarnation(self) -> tuple[int, int | None]:
        """(a number that grows with every start of this node's sidecar, the previous one).
        Peers use it to tell a restarted sidecar from a stale one; etcd registration uses the
        previous one to replace this node's own key after a crash."""
        path = self.run_dir / "incarnation"
        try:
            previous: int | None = int(path.read_text())
        except (OSError, ValueError):
            previous = None
        value = max((previous or 0) + 1, int(time.time() * 1000))
        path.write_text(f"{value}\n")
        return value, previous

    def remove_fallback_socket_dir(self) -> None:
        """Remove the /tmp socket folder (if used) after Mosquitto stopped."""
        if self.socket_dir.parent == SOCKET_FALLBACK_ROOT:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def user_settings(config: NodeConfig) -> broker_conf.UserSettings | None:
    """The user's own Mosquitto settings (`mqtt.include`), or None without any."""
    include = config["mqtt"]["include"]
    return broker_conf.read_user_settings(Path(include)) if include else None


def max_queued_messages(config: NodeConfig) -> int:
    """Mosquitto's `max_queued_messages` on this node: the user's, else mqfed's default."""
    user = user_settings(config)
    return user.max_queued if user is not None else broker_conf.DEFAULT_MAX_QUEUED


def render_mosquitto_conf(config: NodeConfig, layout: NodeLayout, secret: str,
                          link_secret: str = "") -> str:
    """The Mosquitto config text for this node (see sidecar.broker.conf); `link_secret`:
    the password its peers' links give (`routing.links`; "" for none)."""
    mqtt = config["mqtt"]
    include = Path(mqtt["include"]) if mqtt["include"] else None
    user = user_settings(config)
    return broker_conf.render(broker_conf.BrokerConfig(
        node_id=config.node_id, plugin_path=find_plugin(mqtt["plugin"]),
        socket_path=layout.socket_path, secret=secret, listen=mqtt["listen"], user=user,
        include_path=include, external_auth=mqtt["external_auth"],
        external_acl=mqtt["external_acl"], fwd_backlog_max=config["overload"]["backlog_max"],
        sidecar_id=sidecar_client_id(secret), message_size_limit=mqtt["message_size_limit"],
        catchup_ms=int(config["catchup"]["window"] * 1000),
        catchup_bytes=config["catchup"]["max_bytes"],
        journal_dir=layout.socket_dir if mqtt["journal"] else None,
        capture_socket=layout.capture_socket if config["routing"]["capture"] else None,
        link_secret=link_secret,
    ))
