#!/usr/bin/env bash
# Regenerate the Python modules beside proto/raftkv_proto/*.proto (import name `raftkv_proto`, so
# they never collide with another distribution's top-level `proto`, e.g. proto-plus).
# tests/unit/test_proto_fresh.py fails when the committed modules differ from what this makes.
set -euo pipefail
cd "$(dirname "$0")/../proto"
python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --pyi_out=. raftkv_proto/*.proto
