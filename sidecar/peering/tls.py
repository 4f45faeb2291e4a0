"""Mutual TLS for peer streams (adapter helper): every node presents a certificate signed by
the cluster's CA and accepts only peers whose certificate that CA signed.

Configured with `grpc.tls_cert`, `grpc.tls_key` and `grpc.tls_ca` (PEM files, all three or
none). A node's certificate must name the host of its advertised gRPC address (a DNS or IP
subject alternative name): peers verify it when they dial.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

__all__ = ["PeerTls", "TlsConfigError", "load_peer_tls"]

KEYS = ("tls_cert", "tls_key", "tls_ca")


class TlsConfigError(ValueError):
    """The TLS files cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class PeerTls:
    """PEM bytes of this node's certificate chain and key, and of the cluster CA."""

    cert: bytes
    key: bytes
    ca: bytes

    def server_credentials(self, require_client_auth: bool = True) -> grpc.ServerCredentials:
        """Present our certificate; by default require one the CA signed from every dialler
        (the admin listener does not: admin calls carry the admin token, and `mqfed ctl`
        needs only the CA)."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=require_client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Verify the peer against the CA; present our certificate."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def load_peer_tls(grpc_cfg: Mapping[str, Any]) -> PeerTls | None:
    """The configured TLS material, or None when TLS is off; TlsConfigError if unusable."""
    if not any(grpc_cfg[k] for k in KEYS):
        return None
    data: dict[str, bytes] = {}
    for key in KEYS:
        path = grpc_cfg[key]
        try:
            data[key] = Path(path).read_bytes()
        except OSError as exc:
            raise TlsConfigError(f"cannot read grpc.{key} {path}: {exc.strerror}") from None
        if b"-----BEGIN " not in data[key]:
            raise TlsConfigError(f"grpc.{key} {path} is not a PEM file")
    return PeerTls(data["tls_cert"], data["tls_key"], data["tls_ca"])
