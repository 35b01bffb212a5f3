"""TLS settings that cannot work stop the daemon at start: exit code 2, the setting named,
no traceback, and never a TCP port that serves without the authentication it was given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.proc import REPO
from tests.e2e.test_hostile import _certs

GARBAGE_PEM = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    _certs(d)
    (d / "empty.pem").write_text("")
    (d / "garbage.pem").write_text("this is not a certificate\n")
    (d / "garbage-block.pem").write_text(GARBAGE_PEM)
    return d


CASES = {
    # name: (cert, key, client CA, setting the message must name)
    "empty client CA": ("server.pem", "server.key", "empty.pem", "tls_client_ca_file"),
    "garbage client CA": ("server.pem", "server.key", "garbage.pem", "tls_client_ca_file"),
    "PEM block that is no certificate": (
        "server.pem",
        "server.key",
        "garbage-block.pem",
        "tls_client_ca_file",
    ),
    "a key as the client CA": ("server.pem", "server.key", "ca.key", "tls_client_ca_file"),
    "missing client CA": ("server.pem", "server.key", "absent.pem", "tls_client_ca_file"),
    "garbage certificate": ("garbage.pem", "server.key", "ca.pem", "tls_cert_file"),
    "key of another certificate": ("server.pem", "rogue.key", "ca.pem", "tls_key_file"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_unusable_tls_files_exit_2_naming_the_setting(
    certs: Path, short_tmp: Path, case: str
) -> None:
    cert, key, ca, setting = CASES[case]
    args = [
        sys.executable,
        "-m",
        "server",
        "serve",
        "--data-dir",
        str(short_tmp / "data"),
        # Beyond loopback, so only the client CA stands between the port and the world.
        "--listen",
        "0.0.0.0:0",
        "--metrics-listen",
        "none",
        "--tls-cert-file",
        str(certs / cert),
        "--tls-key-file",
        str(certs / key),
        "--tls-client-ca-file",
        str(certs / ca),
    ]
    try:
        done = subprocess.run(
            args, check=False, cwd=REPO, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{case}: the daemon started and served") from exc
    assert done.returncode == 2, done.stderr
    assert setting in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "serving {" not in done.stderr
