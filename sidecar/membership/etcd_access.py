"""How a node reaches etcd securely (adapter helper): TLS (a CA to verify etcd, optionally a
client certificate) and user/password authentication, from the `[membership]` settings
`etcd_ca`, `etcd_cert`, `etcd_key`, `etcd_user`, `etcd_password` / `etcd_password_file`.

`aetcd` 1.0 speaks user/password itself but only plaintext gRPC; `EtcdClient` is an
`aetcd.Client` whose channel is TLS when a CA is configured. With authentication, a lost etcd
session token (etcd restarted, or the token expired) is refreshed by reconnecting
(`EtcdMembership` closes the client on an UNAUTHENTICATED answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import grpc
from aetcd import rpc, watcher

from sidecar.tokens import AuthError, read_token

__all__ = ["EtcdAccess", "EtcdAccessError", "EtcdClient", "load_etcd_access"]


class EtcdAccessError(ValueError):
    """The etcd TLS or credential files cannot be used; the message names the file."""


@dataclass(frozen=True)
class EtcdAccess:
    """TLS material (PEM bytes; `ca` empty: plaintext) and credentials (`user` empty: none)."""

    ca: bytes = b""
    cert: bytes = b""
    key: bytes = b""
    user: str = ""
    password: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.ca)

    def describe(self) -> str:
        """For logs: what protects the connection (never a secret)."""
        parts = ["TLS" + (" with a client certificate" if self.cert else "") if self.tls
                 else "plaintext"]
        if self.user:
            parts.append(f"user {self.user!r}")
        return ", ".join(parts)


def _pem(key: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise EtcdAccessError(f"cannot read membership.{key} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise EtcdAccessError(f"membership.{key} {path} is not a PEM file")
    return data


def load_etcd_access(membership: Mapping[str, Any]) -> EtcdAccess:
    """The configured access (config validation already checked which keys go together)."""
    files = {k: _pem(k, membership[k]) if membership[k] else b""
             for k in ("etcd_ca", "etcd_cert", "etcd_key")}
    password = membership["etcd_password"]
    if membership["etcd_password_file"]:
        try:
            password = read_token(membership["etcd_password_file"], "etcd password")
        except AuthError as exc:
            raise EtcdAccessError(str(exc)) from None
    return EtcdAccess(files["etcd_ca"], files["etcd_cert"], files["etcd_key"],
                      membership["etcd_user"], password)


class EtcdClient(aetcd.Client):
    """`aetcd.Client` over TLS when `access` has a CA (same API)."""

    def __init__(self, host: str, port: int, access: EtcdAccess, **kwargs: Any) -> None:
        super().__init__(host, port, username=access.user or None,
                         password=access.password or None if access.user else None, **kwargs)
        self._access = access

    async def connect(self) -> None:
        if not self._access.tls:
            await super().connect()
            return
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        access = self._access
        credentials = grpc.ssl_channel_credentials(
            root_certificates=access.ca, private_key=access.key or None,
            certificate_chain=access.cert or None)
        try:
            self._is_connecting = True
            self.channel = rpc.secure_channel(f"{self._host}:{self._port}", credentials,
                                              options=self._options.items())
            try:
                if access.user:
                    self.auth_stub = rpc.AuthStub(self.channel)
                    resp = await self.auth_stub.Authenticate(
                        rpc.AuthenticateRequest(name=access.user, password=access.password),
                        timeout=self._timeout)
                    self.metadata = (("token", resp.token),)
            except rpc.AioRpcError as exc:
                aetcd.exceptions._handle_exception(exc)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                            metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False
