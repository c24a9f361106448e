#!/usr/bin/env bash
# Regenerate the Python modules beside proto/*.proto. tests/unit/test_proto_fresh.py fails when
# the committed modules differ from what this script produces.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --pyi_out=. proto/raft.proto proto/kv.proto proto/etcd_kv.proto proto/export.proto
