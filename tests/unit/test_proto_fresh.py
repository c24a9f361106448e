"""The generated modules in proto/raftkv_proto/ must be exactly what scripts/gen_proto.sh makes from
the .proto files beside them: an edited .proto with stale modules would run the old wire format."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
PROTOS = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "raftkv_proto").glob("*.proto"))
SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def regenerate(out: Path) -> None:
    """Run protoc as scripts/gen_proto.sh does (same include root and flags), writing into out."""
    flags = [f"--python_out={out}", f"--grpc_python_out={out}", f"--pyi_out={out}"]
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", *flags, *PROTOS],
        cwd=PROTO_ROOT, capture_output=True, text=True,
    )
    # grpcio-tools comes with the `test` extra (pip install -e .[test]), pinned to the version
    # the committed modules were generated with.
    assert result.returncode == 0, f"protoc failed:\n{result.stderr}"


def test_there_are_protos() -> None:
    """Guards the freshness check against passing vacuously on an empty glob."""
    assert {"raftkv_proto/kv.proto", "raftkv_proto/raft.proto"} <= set(PROTOS)


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    regenerate(tmp_path)
    stale = []
    for proto in PROTOS:
        stem = proto.removesuffix(".proto")
        for suffix in SUFFIXES:
            committed, fresh = PROTO_ROOT / f"{stem}{suffix}", tmp_path / f"{stem}{suffix}"
            assert fresh.exists(), f"protoc did not produce {fresh.name}"
            if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
                stale.append(f"{stem}{suffix}")
    assert not stale, f"generated modules differ from their .proto files: {stale}; run scripts/gen_proto.sh"


def test_the_import_name_is_ours() -> None:
    """The generated modules import each other as `raftkv_proto`, never as a bare `proto`."""
    import raftkv_proto.export_pb2 as export_pb2

    assert export_pb2.__name__ == "raftkv_proto.export_pb2"
    assert "from proto " not in (PROTO_ROOT / "raftkv_proto" / "export_pb2.py").read_text()
