"""A throw-away CA and certificates made with the real `openssl` tool, readable by the
`mosquitto` user Mosquitto drops to."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.system.plugin.helpers import give_to_mosquitto

EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certs(folder: Path, names: tuple[str, ...]) -> Path:
    """`ca.pem`, and per name (its CN) `<name>.pem` / `<name>.key` signed by the CA, in
    `folder` (which the `mosquitto` user must be able to enter)."""
    _openssl("req", "-x509", *EC, "-days", "2", "-subj", "/CN=mqfed-test-ca",
             "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem"))
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
    for name in names:
        _openssl("req", *EC, "-subj", f"/CN={name}", "-keyout", str(folder / f"{name}.key"),
                 "-out", str(folder / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA",
                 str(folder / "ca.pem"), "-CAkey", str(folder / "ca.key"), "-CAcreateserial",
                 "-days", "2", "-out", str(folder / f"{name}.pem"), "-extfile", str(ext))
    for path in folder.iterdir():
        give_to_mosquitto(path, 0o644 if path.suffix == ".pem" else 0o600)
    return folder
