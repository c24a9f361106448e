"""Files read again when they change (raft/transport/tls_reload.py): a Reloading builds its value
again only when the files' stat changed, keeps the last good value while they do not load (one
warning until they do), and raises only at start; a revocation list read in PEM or DER."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kv.tools.certs import ensure_ca, issue
from raft.transport.tls_reload import Reloading, Revocations, revoked_serials
from tests.integration.peer_tls import replace_file, write_crl


def number(path: Path) -> int:
    """The build under test: the file's text as a number (ValueError when it is not one)."""
    return int(path.read_text())


def test_a_value_is_built_again_only_when_its_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("1")
    builds: list[int] = []

    def build() -> int:
        builds.append(number(path))
        return builds[-1]

    reloading = Reloading([path], build, "the number")
    assert [reloading.current() for _ in range(3)] == [1, 1, 1] and builds == [1]
    replace_file(path, b"2")
    assert reloading.current() == 2 and reloading.current() == 2 and builds == [1, 2]


def test_files_that_do_not_load_leave_the_last_good_value_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raft.transport.tls_reload")
    path = tmp_path / "n"
    path.write_text("1")
    reloading = Reloading([path], lambda: number(path), "the number")
    for broken in (b"half", b"half-wri", b""):
        replace_file(path, broken)
        assert reloading.current() == 1
    path.unlink()
    assert reloading.current() == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("the number changed but cannot be loaded"), warnings
    replace_file(path, b"3")
    assert reloading.current() == 3
    assert caplog.records[-1].getMessage() == "the number loaded again: new connections use the new files"


def test_files_that_do_not_load_at_start_raise(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("half")
    with pytest.raises(ValueError):
        Reloading([path], lambda: number(path), "the number")


def test_a_revocation_list_in_pem_or_der_names_the_revoked_serials(tmp_path: Path) -> None:
    ensure_ca(tmp_path)
    revoked, kept = issue(tmp_path, "carol", server=False), issue(tmp_path, "dave", server=False)
    serial = x509.load_pem_x509_certificate(revoked.cert.read_bytes()).serial_number
    pem = write_crl(tmp_path, [revoked.cert], tmp_path / "crl.pem")
    der = tmp_path / "crl.der"
    der.write_bytes(x509.load_pem_x509_crl(pem.read_bytes()).public_bytes(serialization.Encoding.DER))
    assert revoked_serials(pem) == revoked_serials(der) == {serial}
    revocations = Revocations(pem, "--client-crl-file")
    assert revocations.refusal_of({"serialNumber": f"{serial:X}"}) == (
        f"certificate serial {serial:x} is revoked (--client-crl-file)")
    kept_serial = x509.load_pem_x509_certificate(kept.cert.read_bytes()).serial_number
    assert revocations.refusal_of({"serialNumber": f"{kept_serial:X}"}) is None
    assert revocations.refusal_of({}) is None and revocations.refusal_of(None) is None
    with pytest.raises(ValueError, match="not a certificate revocation list"):
        revoked_serials(revoked.cert)
