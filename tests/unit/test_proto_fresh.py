"""The generated modules in proto/ must be exactly what scripts/gen_proto.sh makes from the .proto
files: an edited .proto with stale modules would run the old wire format."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTOS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "proto").glob("*.proto"))
SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def regenerate(out: Path) -> None:
    """Run protoc as scripts/gen_proto.sh does (same include root and flags), writing into out."""
    flags = [f"--python_out={out}", f"--grpc_python_out={out}", f"--pyi_out={out}"]
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", *flags, *PROTOS],
        cwd=REPO, capture_output=True, text=True,
    )
    # grpcio-tools comes with the `test` extra (pip install -e .[test]), pinned to the version
    # the committed modules were generated with.
    assert result.returncode == 0, f"protoc failed:\n{result.stderr}"


def test_there_are_protos() -> None:
    """Guards the freshness check against passing vacuously on an empty glob."""
    assert {"proto/kv.proto", "proto/raft.proto"} <= set(PROTOS)


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    regenerate(tmp_path)
    stale = []
    for proto in PROTOS:
        stem = proto.removesuffix(".proto")
        for suffix in SUFFIXES:
            committed, fresh = REPO / f"{stem}{suffix}", tmp_path / f"{stem}{suffix}"
            assert fresh.exists(), f"protoc did not produce {fresh.name}"
            if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
                stale.append(f"{stem}{suffix}")
    assert not stale, f"generated modules differ from their .proto files: {stale}; run scripts/gen_proto.sh"
