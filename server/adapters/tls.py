"""TLS files checked before the daemon binds: a setting that names a missing, empty or
non-PEM file stops the start with the setting's name, rather than a traceback from grpc
or, worse, a TCP port that rejects everyone (an empty CA) or is open.

OpenSSL (through the standard `ssl` module) does the parsing, as grpc's would."""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsFileError(ValueError):
    """A TLS setting names a file that cannot serve; the message names the setting."""


def _read(setting: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsFileError(f"{setting}: cannot read {path}: {exc.strerror}") from None
    if not data.strip():
        raise TlsFileError(f"{setting}: {path} is empty")
    if b"-----BEGIN " not in data:
        raise TlsFileError(f"{setting}: {path} is not PEM")
    return data


def load_tls(cert_file: str, key_file: str, ca_file: str) -> tuple[bytes, bytes, bytes | None]:
    """(certificate chain, private key, client CA or None), each checked by OpenSSL."""
    cert = _read("tls_cert_file", cert_file)
    key = _read("tls_key_file", key_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, ValueError) as exc:
        raise TlsFileError(
            f"tls_cert_file/tls_key_file: {cert_file} and {key_file} are not a matching "
            f"PEM certificate and private key ({exc})"
        ) from None
    if not ca_file:
        return cert, key, None
    ca = _read("tls_client_ca_file", ca_file)
    try:
        ctx.load_verify_locations(cadata=ca.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:
        raise TlsFileError(
            f"tls_client_ca_file: {ca_file} holds no usable PEM CA certificate ({exc})"
        ) from None
    return cert, key, ca
