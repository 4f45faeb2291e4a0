"""Real Mosquitto brokers with the mqfed plugin, a fake sidecar and plain MQTT clients."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.harness.procs import ManagedProcess, ProcessGroup, free_port, port_open, wait_for

ROOT = Path(__file__).resolve().parents[3]
PLUGIN_DIR = ROOT / "deploy" / "mosquitto-plugin"
PLUGIN_SO = PLUGIN_DIR / "build" / "mqfed_plugin.so"
DYNSEC_SO = Path("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so")
MOSQUITTO = "/usr/sbin/mosquitto"

SECRET = "test-sidecar-secret"
SIDECAR_ID = "mqfed-sidecar"
SIDECAR_USER = "mqfed-sidecar"
CALIBRATION_EXPIRY = 1234567891
EVENTS = "$SYS/broker/mqfed/events"
CONTROL = "$CONTROL/mqfed/v1"
REPLIES = "$SYS/broker/mqfed/replies/"
NEVER = 4294967295


def build_plugin() -> Path:
    """Build the plugin with its Makefile (incremental); fail loudly if that is impossible."""
    try:
        r = subprocess.run(["make", "-C", str(PLUGIN_DIR)], capture_output=True, text=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot build the mqfed plugin with make: {e}") from e
    if r.returncode != 0 or not PLUGIN_SO.exists():
        raise RuntimeError(
            f"building the mqfed plugin failed (make -C {PLUGIN_DIR}):\n{r.stdout}\n{r.stderr}")
    return PLUGIN_SO


def mosquitto_dir() -> Path:
    """A fresh folder the `mosquitto` user (Mosquitto drops root privileges) can write."""
    d = Path(tempfile.mkdtemp(prefix="mqfed-plugin-", dir="/tmp"))
    os.chmod(d, 0o755)
    if os.geteuid() == 0:
        shutil.chown(d, "mosquitto", "mosquitto")
    return d


def give_to_mosquitto(path: Path, mode: int = 0o600) -> None:
    os.chmod(path, mode)
    if os.geteuid() == 0:
        shutil.chown(path, "mosquitto", "mosquitto")


class Broker:
    """One Mosquitto process: the plugin (optional) first, a unix listener for the sidecar and
    a TCP listener for ordinary clients."""

    def __init__(self, procs: ProcessGroup, name: str = "mosquitto", plugin: bool = True,
                 opts: dict[str, Any] | None = None, extra: str = "",
                 tcp_extra: str = "", allow_anonymous: bool = True,
                 wrapper: list[str] | None = None, log_all: bool = False) -> None:
        self.procs = procs
        self.name = name
        self.dir = mosquitto_dir()
        self.sock = str(self.dir / "mosquitto.sock")
        self.port = free_port()
        self.conf = self.dir / "mosquitto.conf"
        self.plugin = plugin
        self.opts = {"sidecar_secret": SECRET, **(opts or {})}
        self.extra = extra
        self.tcp_extra = tcp_extra
        self.allow_anonymous = allow_anonymous
        self.wrapper = wrapper or []
        self.log_all = log_all
        self.proc: ManagedProcess | None = None

    def config_text(self) -> str:
        lines = ["per_listener_settings false"]
        if self.plugin:
            lines.append(f"plugin {PLUGIN_SO}")
            lines += [f"plugin_opt_{k} {v}" for k, v in self.opts.items() if v is not None]
        if self.extra:
            lines.append(self.extra.strip())
        lines += [
            "persistence false",
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
            "log_dest stderr",
        ]
        if self.log_all:
            lines.append("log_type all")
        else:
            lines += ["log_type error", "log_type warning", "log_type notice",
                      "log_type information"]
        lines += [f"listener 0 {self.sock}", f"listener {self.port} 127.0.0.1"]
        if self.tcp_extra:
            lines.append(self.tcp_extra.strip())
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 10.0) -> Broker:
        self.conf.write_text(self.config_text())
        give_to_mosquitto(self.conf, 0o644)
        self.proc = self.procs.start(self.name, [*self.wrapper, MOSQUITTO, "-c", str(self.conf)])
        try:
            wait_for(lambda: self.proc.alive() is False or (
                port_open(self.port) and os.path.exists(self.sock)), timeout,
                f"{self.name} listening on {self.port} and {self.sock}")
        except TimeoutError:
            raise
        if not self.proc.alive():
            raise RuntimeError(f"{self.name} exited at start:\n{self.proc.tail()}")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def log(self) -> str:
        return self.proc.log_text() if self.proc else ""

    def stop(self, timeout: float = 10.0) -> int | None:
        return self.proc.stop(timeout=timeout) if self.proc else None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class ConnectFailed(Exception):
    """The client got no CONNACK (network failure) or a refusal (`reason` set)."""

    def __init__(self, msg: str, reason: int | None = None) -> None:
        super().__init__(msg)
        self.reason = reason


class Client:
    """A blocking wrapper around a paho client (MQTT v5, v3.1.1 or v3.1)."""

    def __init__(self, client_id: str, port: int | None = None, sock: str | None = None,
                 protocol: int = 5, clean_start: bool = True,
                 session_expiry: int | None = None, username: str | None = None,
                 password: str | None = None, keepalive: int = 60,
                 will: tuple[str, bytes] | None = None) -> None:
        proto = {5: mqtt.MQTTv5, 4: mqtt.MQTTv311, 3: mqtt.MQTTv31}[protocol]
        self.protocol = protocol
        self.client_id = client_id
        kw: dict[str, Any] = {}
        if protocol != 5:
            kw["clean_session"] = clean_start
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=proto,
                             transport="unix" if sock else "tcp", reconnect_on_failure=False,
                             **kw)
        self.host = sock or "127.0.0.1"
        self.port = port or 1883
        self.clean_start = clean_start
        self.session_expiry = session_expiry
        self.keepalive = keepalive
        if username is not None:
            self.c.username_pw_set(username, password)
        if will:
            self.c.will_set(will[0], will[1], qos=1)
        self.cond = threading.Condition()
        self.connack: tuple[int, bool] | None = None
        self.disconnected = False
        self.disconnect_reason: Any = None
        self.messages: list[mqtt.MQTTMessage] = []
        self.acks: dict[int, Any] = {}
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_ack
        self.c.on_unsubscribe = self._on_ack

    def _on_connect(self, client, userdata, flags, rc, props=None):
        with self.cond:
            self.connack = (rc.value if hasattr(rc, "value") else int(rc),
                            bool(flags.session_present))
            self.cond.notify_all()

    def _on_disconnect(self, client, userdata, flags, rc, props=None):
        with self.cond:
            self.disconnected = True
            self.disconnect_reason = rc
            self.cond.notify_all()

    def _on_message(self, client, userdata, msg):
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def _on_ack(self, client, userdata, mid, reason_codes, props=None):
        with self.cond:
            self.acks[mid] = reason_codes
            self.cond.notify_all()

    def connect(self, timeout: float = 5.0) -> bool:
        """Connect and wait for the CONNACK; returns session_present. Raises ConnectFailed."""
        props = None
        if self.protocol == 5:
            props = Properties(PacketTypes.CONNECT)
            if self.session_expiry is not None:
                props.SessionExpiryInterval = self.session_expiry
        self.connack = None
        self.disconnected = False
        kw: dict[str, Any] = {"keepalive": self.keepalive, "properties": props}
        if self.protocol == 5:
            kw["clean_start"] = self.clean_start
        self.c.connect(self.host, self.port, **kw)
        self.c.loop_start()
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.connack is None and not self.disconnected:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
        if self.connack is None:
            self.c.loop_stop()
            raise ConnectFailed(f"{self.client_id}: no CONNACK (network failure)")
        if self.connack[0] != 0:
            self.c.loop_stop()
            raise ConnectFailed(f"{self.client_id}: refused with {self.connack[0]}",
                                self.connack[0])
        return self.connack[1]

    def _wait_ack(self, mid: int, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while mid not in self.acks:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.client_id}: no ack for mid {mid}")
                self.cond.wait(left)
            return self.acks.pop(mid)

    def subscribe(self, topic: str | list[tuple[str, int]], qos: int = 0,
                  timeout: float = 5.0) -> list[int]:
        rc, mid = self.c.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        codes = self._wait_ack(mid, timeout)
        return [getattr(c, "value", c) for c in codes]

    def unsubscribe(self, topic: str | list[str], timeout: float = 5.0) -> Any:
        rc, mid = self.c.unsubscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        return self._wait_ack(mid, timeout)

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 1,
                retain: bool = False, properties: Properties | None = None,
                timeout: float = 5.0) -> None:
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if qos > 0:
            info.wait_for_publish(timeout)

    def wait_messages(self, pred: Callable[[mqtt.MQTTMessage], bool], count: int = 1,
                      timeout: float = 5.0) -> list[mqtt.MQTTMessage]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [m for m in self.messages if pred(m)]
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    return got
                self.cond.wait(left)

    def wait_disconnected(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.disconnected:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def disconnect(self, session_expiry: int | None = None) -> None:
        props = None
        if self.protocol == 5 and session_expiry is not None:
            props = Properties(PacketTypes.DISCONNECT)
            props.SessionExpiryInterval = session_expiry
        try:
            self.c.disconnect(properties=props)
            self.wait_disconnected(2.0)
        finally:
            self.c.loop_stop()

    def drop(self) -> None:
        """Close the socket without a DISCONNECT packet (like a crashed client)."""
        sock = self.c.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.wait_disconnected(2.0)
        self.c.loop_stop()

    def close(self) -> None:
        try:
            self.c.disconnect()
        except Exception:
            pass
        self.c.loop_stop()


class FakeSidecar(Client):
    """The sidecar's side of the protocol: receives events and replies, acks, sends commands."""

    def __init__(self, sock: str, client_id: str = SIDECAR_ID, username: str = SIDECAR_USER,
                 password: str = SECRET, session_expiry: int = CALIBRATION_EXPIRY,
                 auto_ack: bool = True, clean_start: bool = False) -> None:
        super().__init__(client_id, sock=sock, protocol=5, clean_start=clean_start,
                         session_expiry=session_expiry, username=username, password=password)
        self.auto_ack = auto_ack
        self.events: list[dict] = []          # every event received, in arrival order
        self.replies: dict[str, list[dict]] = {}
        self.other: list[mqtt.MQTTMessage] = []
        self.epoch: str | None = None
        self.contig = 0                       # highest seq with everything before it received
        self.seen: set[int] = set()
        self.acked = 0
        self._since_ack = 0
        self.event_messages = 0  # MQTT messages on the events topic
        self._stop = threading.Event()
        self._acker: threading.Thread | None = None

    def _on_message(self, client, userdata, msg):
        if msg.topic != EVENTS and not msg.topic.startswith(REPLIES):
            with self.cond:
                self.other.append(msg)
            super()._on_message(client, userdata, msg)
            return
        ack = None
        with self.cond:
            if msg.topic == EVENTS:  # several events per message with event_batch
                self.event_messages += 1
                for line in msg.payload.split(b"\n"):
                    ack = self._on_event(json.loads(line)) or ack
            else:
                data = json.loads(msg.payload)
                self.replies.setdefault(data.get("id"), []).append(data)
            self.cond.notify_all()
        if ack is not None:
            self.send({"v": 1, "cmd": "ack", "seq": ack, "epoch": self.epoch})

    def _on_event(self, data: dict) -> int | None:
        """Record one event (under the lock); the seq to ack now, if any."""
        self.events.append(data)
        if self.epoch is None:
            self.epoch = data["epoch"]
        if data["epoch"] != self.epoch:
            return None
        self.seen.add(data["seq"])
        while self.contig + 1 in self.seen:
            self.contig += 1
        self._since_ack += 1
        if self.auto_ack and self._since_ack >= 100 and self.contig > self.acked:
            self.acked = self.contig
            self._since_ack = 0
            return self.acked
        return None

    def _ack_loop(self) -> None:
        while not self._stop.wait(0.05):
            with self.cond:
                if not self.auto_ack or self.contig <= self.acked:
                    continue
                seq = self.acked = self.contig
                self._since_ack = 0
                epoch = self.epoch
            self.send({"v": 1, "cmd": "ack", "seq": seq, "epoch": epoch})

    def connect(self, timeout: float = 5.0) -> bool:
        present = super().connect(timeout)
        self._stop.clear()
        self._acker = threading.Thread(target=self._ack_loop, daemon=True)
        self._acker.start()
        return present

    def _stop_acker(self) -> None:
        self._stop.set()
        if self._acker:
            self._acker.join(2)

    def disconnect(self, session_expiry: int | None = None) -> None:
        self._stop_acker()
        super().disconnect(session_expiry)

    def close(self) -> None:
        self._stop_acker()
        super().close()

    def send(self, obj: dict | bytes | str, topic: str = CONTROL) -> None:
        payload = obj if isinstance(obj, (bytes, str)) else json.dumps(obj)
        self.c.publish(topic, payload, qos=1)

    def request(self, cmd: str, timeout: float = 5.0, expect: int | None = 1,
                **fields: Any) -> list[dict]:
        """Send a command; wait for `expect` replies (None: as many as `chunks` says)."""
        rid = uuid.uuid4().hex
        msg = {"v": 1, "id": rid, "reply": REPLIES + rid, "cmd": cmd, **fields}
        self.send(msg)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = self.replies.get(rid, [])
                want = expect
                if want is None and got:
                    want = got[0].get("chunks", 1)
                if want is not None and len(got) >= want:
                    return list(got)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply to {cmd} ({len(got)} of {want})")
                self.cond.wait(left)

    def call(self, cmd: str, **fields: Any) -> dict:
        return self.request(cmd, **fields)[0]

    def snapshot(self, timeout: float = 10.0) -> tuple[int, list[dict]]:
        """Take a snapshot; the stream then continues after its cut."""
        replies = self.request("snapshot", timeout=timeout, expect=None)
        replies.sort(key=lambda r: r["chunk"])
        assert [r["chunk"] for r in replies] == list(range(replies[0]["chunks"]))
        cut = replies[0]["seq"]
        assert all(r["seq"] == cut and r["ok"] for r in replies)
        with self.cond:
            self.epoch = replies[0]["epoch"]
            self.seen = {s for s in self.seen if s > cut}
            self.contig = max(self.contig, cut)
            while self.contig + 1 in self.seen:
                self.contig += 1
            self.acked = max(self.acked, cut)
        return cut, [c for r in replies for c in r["clients"]]

    def resume(self, from_seq: int, **fields: Any) -> dict:
        with self.cond:
            self.contig = max(self.contig, from_seq - 1)
            while self.contig + 1 in self.seen:
                self.contig += 1
        rep = self.call("resume", from_seq=from_seq, **fields)
        if rep["ok"]:
            with self.cond:
                self.epoch = rep["epoch"]
        return rep

    def continue_from(self, old: FakeSidecar) -> FakeSidecar:
        """Take over what a previous sidecar instance learned (a restart with state)."""
        with old.cond:
            self.events = list(old.events)
            self.epoch = old.epoch
            self.contig = old.contig
            self.seen = set(old.seen)
            self.acked = old.acked
        return self

    def start(self) -> FakeSidecar:
        """Connect and start the stream from the beginning of this plugin run."""
        self.connect()
        rep = self.resume(1)
        assert rep["ok"], rep
        return self

    def wait_events(self, pred: Callable[[dict], bool], count: int = 1,
                    timeout: float = 5.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [e for e in self.unique_events() if pred(e)]
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    return got
                self.cond.wait(left)

    def wait_type(self, typ: str, count: int = 1, timeout: float = 5.0,
                  **match: Any) -> list[dict]:
        got = self.wait_events(
            lambda e: e["type"] == typ and all(e.get(k) == v for k, v in match.items()),
            count, timeout)
        assert len(got) >= count, (
            f"expected {count} {typ} events matching {match}, got {got}; "
            f"all: {[(e['seq'], e['type']) for e in self.unique_events()][-30:]}")
        return got

    def unique_events(self) -> list[dict]:
        """Events of the current epoch, one per seq, by seq."""
        with self.cond:
            by_seq = {e["seq"]: e for e in self.events if e["epoch"] == self.epoch}
        return [by_seq[s] for s in sorted(by_seq)]

    def wait_synced(self, timeout: float = 5.0) -> list[dict]:
        """Wait until we have every event up to the plugin's current seq (stats)."""
        target = self.call("stats")["seq"]
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.contig < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"stream at {self.contig}, plugin at {target}")
                self.cond.wait(left)
        return self.unique_events()


class EventModel:
    """The sidecar's view rebuilt from events only (the rules of docs/plugin-protocol.md)."""

    def __init__(self) -> None:
        self.clients: dict[str, dict] = {}

    def apply(self, ev: dict) -> None:
        t = ev["type"]
        if t == "connect":
            old = self.clients.get(ev["client"])
            subs = dict(old["subs"]) if (old and ev["session_present"]) else {}
            self.clients[ev["client"]] = {
                "username": ev["username"], "protocol": ev["protocol"],
                "clean_start": ev["clean_start"], "session_expiry": ev["session_expiry"],
                "online": True, "subs": subs}
        elif t == "disconnect":
            if ev["session_kept"]:
                c = self.clients[ev["client"]]
                c["online"] = False
                c["session_expiry"] = ev["session_expiry"]
            else:
                self.clients.pop(ev["client"], None)
        elif t == "subscribe":
            self.clients[ev["client"]]["subs"][ev["filter"]] = ev["qos"]
        elif t == "unsubscribe":
            self.clients[ev["client"]]["subs"].pop(ev["filter"], None)
        elif t == "session_expired":
            self.clients.pop(ev["client"], None)

    def apply_all(self, events: list[dict]) -> EventModel:
        for e in events:
            self.apply(e)
        return self

    def load_snapshot(self, clients: list[dict]) -> EventModel:
        self.clients = normalize_snapshot(clients)
        return self


def normalize_snapshot(clients: list[dict]) -> dict[str, dict]:
    return {c["client"]: {
        "username": c["username"], "protocol": c["protocol"], "clean_start": c["clean_start"],
        "session_expiry": c["session_expiry"], "online": c["online"],
        "subs": {s["filter"]: s["qos"] for s in c["subscriptions"]}} for c in clients}


def user_props(props: Properties | None) -> list[tuple[str, str]]:
    return list(getattr(props, "UserProperty", []) or []) if props else []


# ---- a hand-driven MQTT v5 client ---------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return len(b).to_bytes(2, "big") + b


_PROP_BYTE = {0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A}
_PROP_U16 = {0x13, 0x21, 0x22, 0x23}
_PROP_U32 = {0x02, 0x11, 0x18, 0x27}
_PROP_STR = {0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F}
_PROP_BIN = {0x09, 0x16}


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    n, mult = 0, 1
    while True:
        b = buf[pos]
        pos += 1
        n += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            return n, pos


def _read_props(buf: bytes, pos: int) -> tuple[dict[int, list], int]:
    plen, pos = _read_varint(buf, pos)
    end = pos + plen
    props: dict[int, list] = {}
    while pos < end:
        pid, pos = _read_varint(buf, pos)
        if pid in _PROP_BYTE:
            v, pos = buf[pos], pos + 1
        elif pid in _PROP_U16:
            v, pos = int.from_bytes(buf[pos:pos + 2], "big"), pos + 2
        elif pid in _PROP_U32:
            v, pos = int.from_bytes(buf[pos:pos + 4], "big"), pos + 4
        elif pid == 0x0B:
            v, pos = _read_varint(buf, pos)
        elif pid in _PROP_STR or pid in _PROP_BIN:
            n = int.from_bytes(buf[pos:pos + 2], "big")
            v, pos = buf[pos + 2:pos + 2 + n], pos + 2 + n
        elif pid == 0x26:
            n = int.from_bytes(buf[pos:pos + 2], "big")
            k = buf[pos + 2:pos + 2 + n]
            pos += 2 + n
            n = int.from_bytes(buf[pos:pos + 2], "big")
            v = (k, buf[pos + 2:pos + 2 + n])
            pos += 2 + n
        else:
            raise ValueError(f"unknown property {pid:#x}")
        props.setdefault(pid, []).append(v)
    return props, end


class RawMessage:
    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                 sub_ids: list[int], mid: int = 0) -> None:
        self.topic, self.payload, self.qos = topic, payload, qos
        self.retain, self.dup, self.sub_ids, self.mid = retain, dup, sub_ids, mid

    def __repr__(self) -> str:
        return f"RawMessage({self.topic!r}, {self.payload[:20]!r}, q{self.qos}, {self.sub_ids})"


class RawClient:
    """An MQTT v5 client driven packet by packet: a QoS 2 PUBLISH whose PUBREL is sent later, a
    DUP resend, a will of any QoS, an abrupt close. Received messages are acknowledged (QoS 1/2)
    and recorded in `messages`; with `hold_pubrel` a PUBREL is recorded in `pubrels` and not
    answered (the message stays between PUBREC and PUBCOMP); with `hold_pubrec` a QoS 2
    PUBLISH is not answered at all; `receive_maximum` is sent in the CONNECT (Mosquitto's
    in-flight window towards this client)."""

    def __init__(self, client_id: str, sock: str | None = None, port: int | None = None,
                 username: str | None = None, password: str | None = None,
                 clean_start: bool = True, session_expiry: int = 0, keepalive: int = 60,
                 will: tuple[str, bytes, int] | None = None, hold_pubrel: bool = False,
                 hold_pubrec: bool = False, receive_maximum: int | None = None) -> None:
        self.client_id = client_id
        self.receive_maximum = receive_maximum
        self.hold_pubrel, self.hold_pubrec = hold_pubrel, hold_pubrec
        self.pubrels: list[int] = []
        self.addr = sock if sock else ("127.0.0.1", port)
        self.family = socket.AF_UNIX if sock else socket.AF_INET
        self.username, self.password = username, password
        self.clean_start, self.session_expiry = clean_start, session_expiry
        self.keepalive, self.will = keepalive, will
        self.s: socket.socket | None = None
        self.cond = threading.Condition()
        self.messages: list[RawMessage] = []
        self.acks: dict[tuple[int, int], list[int]] = {}   # (packet type, mid) -> reasons
        self.connack: tuple[bool, int] | None = None
        self.closed = False
        self._next_mid = 0
        self._wlock = threading.Lock()
        self._reader: threading.Thread | None = None

    # -- wire
    def _send(self, first: int, body: bytes) -> None:
        with self._wlock:
            assert self.s is not None
            self.s.sendall(bytes([first]) + _varint(len(body)) + body)

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            assert self.s is not None
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def _read_packet(self) -> tuple[int, bytes]:
        first = self._recv_exact(1)[0]
        n, mult = 0, 1
        while True:
            b = self._recv_exact(1)[0]
            n += (b & 0x7F) * mult
            mult *= 128
            if not b & 0x80:
                break
        return first, self._recv_exact(n) if n else b""

    def connect(self, timeout: float = 5.0) -> bool:
        """Connect; returns session_present. Raises ConnectFailed on a refusal."""
        self.s = socket.socket(self.family, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(self.addr)
        flags = 0x02 if self.clean_start else 0
        props = b""
        if self.session_expiry:
            props += b"\x11" + self.session_expiry.to_bytes(4, "big")
        if self.receive_maximum:
            props += b"\x21" + self.receive_maximum.to_bytes(2, "big")
        payload = _str(self.client_id)
        if self.will:
            topic, wpayload, wqos = self.will
            flags |= 0x04 | (wqos << 3)
            payload += _varint(0) + _str(topic) + _str(wpayload)
        if self.username is not None:
            flags |= 0x80
            payload += _str(self.username)
        if self.password is not None:
            flags |= 0x40
            payload += _str(self.password)
        body = (_str("MQTT") + bytes([5, flags]) + self.keepalive.to_bytes(2, "big")
                + _varint(len(props)) + props + payload)
        self._send(0x10, body)
        first, body = self._read_packet()
        if first != 0x20 or body[1] != 0:
            self.s.close()
            raise ConnectFailed(f"{self.client_id}: CONNACK {body!r}",
                                body[1] if len(body) > 1 else None)
        self.connack = (bool(body[0] & 1), body[1])
        self.s.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        return self.connack[0]

    def _read_loop(self) -> None:
        try:
            while True:
                first, body = self._read_packet()
                self._handle(first, body)
        except (OSError, ConnectionError, ValueError):
            pass
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def _handle(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == 3:
            qos = (first >> 1) & 3
            tlen = int.from_bytes(body[:2], "big")
            topic = body[2:2 + tlen].decode()
            pos = 2 + tlen
            mid = 0
            if qos:
                mid = int.from_bytes(body[pos:pos + 2], "big")
                pos += 2
            props, pos = _read_props(body, pos)
            msg = RawMessage(topic, body[pos:], qos, bool(first & 1), bool(first & 8),
                             list(props.get(0x0B, [])), mid)
            with self.cond:
                self.messages.append(msg)
                self.cond.notify_all()
            if qos == 1:
                self._send(0x40, mid.to_bytes(2, "big"))
            elif qos == 2 and not self.hold_pubrec:
                self._send(0x50, mid.to_bytes(2, "big"))
        elif kind == 6:          # PUBREL for a message we received
            with self.cond:
                self.pubrels.append(int.from_bytes(body[:2], "big"))
                self.cond.notify_all()
            if not self.hold_pubrel:
                self._send(0x70, body[:2])
        elif kind in (4, 5, 7, 9, 11):   # PUBACK PUBREC PUBCOMP SUBACK UNSUBACK
            mid = int.from_bytes(body[:2], "big")
            if kind in (9, 11):
                _, pos = _read_props(body, 2)
                reasons = list(body[pos:])
            else:
                reasons = [body[2]] if len(body) > 2 else [0]
            with self.cond:
                self.acks[(kind, mid)] = reasons
                self.cond.notify_all()

    def _mid(self) -> int:
        self._next_mid = self._next_mid % 65535 + 1
        return self._next_mid

    def wait_ack(self, kind: int, mid: int, timeout: float = 5.0) -> list[int]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while (kind, mid) not in self.acks:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise TimeoutError(f"{self.client_id}: no ack {kind} for mid {mid}")
                self.cond.wait(left)
            return self.acks.pop((kind, mid))

    # -- operations
    def publish(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False,
                mid: int | None = None, dup: bool = False, wait: bool = True,
                props: bytes = b"") -> int:
        """Send a PUBLISH (`props`: its encoded properties). QoS 1: waits for the PUBACK; QoS 2:
        waits for the PUBREC only (the PUBREL is `pubrel`), unless wait=False. Returns the mid."""
        if qos and mid is None:
            mid = self._mid()
        body = (_str(topic) + (mid.to_bytes(2, "big") if qos else b"") + _varint(len(props))
                + props + payload)
        self._send(0x30 | (dup << 3) | (qos << 1) | int(retain), body)
        if wait and qos:
            self.wait_ack(4 if qos == 1 else 5, mid)
        return mid or 0

    def pubrel(self, mid: int, wait: bool = True) -> None:
        self._send(0x62, mid.to_bytes(2, "big"))
        if wait:
            self.wait_ack(7, mid)

    def publish2(self, topic: str, payload: bytes = b"") -> int:
        """A complete QoS 2 flow."""
        mid = self.publish(topic, payload, qos=2)
        self.pubrel(mid)
        return mid

    def subscribe(self, filt: str, qos: int = 2, no_local: bool = False,
                  sub_id: int | None = None) -> list[int]:
        mid = self._mid()
        props = b"\x0b" + _varint(sub_id) if sub_id else b""
        body = (mid.to_bytes(2, "big") + _varint(len(props)) + props + _str(filt)
                + bytes([qos | (0x04 if no_local else 0)]))
        self._send(0x82, body)
        return self.wait_ack(9, mid)

    def received(self, pred: Callable[[RawMessage], bool] = lambda m: True) -> list[RawMessage]:
        with self.cond:
            return [m for m in self.messages if pred(m)]

    def wait_messages(self, pred: Callable[[RawMessage], bool], count: int = 1,
                      timeout: float = 5.0) -> list[RawMessage]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [m for m in self.messages if pred(m)]
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    return got
                self.cond.wait(left)

    def disconnect(self) -> None:
        try:
            self._send(0xE0, b"")
        except OSError:
            pass
        self.close()

    def drop(self) -> None:
        """Close the socket without a DISCONNECT (the will is published)."""
        self.close()

    def close(self) -> None:
        if self.s is not None:
            try:
                self.s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.s.close()
        if self._reader:
            self._reader.join(2)


def inject(sc: FakeSidecar, batch_id: int, data: bytes, timeout: float = 5.0) -> dict:
    """Send MQFB batch `data` (its id `batch_id`) to `$CONTROL/mqfed/inject` on the control
    connection; the plugin's reply."""
    sc.send(data, topic="$CONTROL/mqfed/inject")
    deadline = time.monotonic() + timeout
    with sc.cond:
        while True:
            for r in sc.replies.get(None, []):
                if r.get("cmd") == "inject" and r.get("batch") == batch_id:
                    return r
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to inject batch {batch_id}")
            sc.cond.wait(left)


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def publish_windowed(port: int, client_id: str, topic: str, messages: int, size: int,
                     window: int = 100) -> tuple[mqtt.Client, float]:
    """Publish `messages` QoS 1 messages of `size` bytes flat out, at most `window` of them
    unacknowledged (a benchmark's load); the still connected client and the seconds until
    the last PUBACK."""
    pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id=client_id, protocol=mqtt.MQTTv5)
    slots = threading.Semaphore(window)
    pub.on_publish = lambda *a: slots.release()
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    payload = b"x" * size
    t0 = time.monotonic()
    for _ in range(messages):
        slots.acquire()
        pub.publish(topic, payload, qos=1)
    for _ in range(window):
        slots.acquire()
    return pub, time.monotonic() - t0
