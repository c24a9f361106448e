"""The `raftkv` process chooses gRPC's polling I/O manager before grpc is imported (kv/tools/grpc_io.py).

gRPC reads the choice once, at import, so these run fresh interpreters: in this pytest process
grpc is long imported."""
from __future__ import annotations

import os
import subprocess
import sys

from kv.tools.grpc_io import GRPC_EXPERIMENTS_VAR, POLLING_IO_MANAGER, prefer_polling_io_manager


def _fresh(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_VAR}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


def test_importing_the_package_does_not_import_grpc() -> None:
    # What lets kv.tools.cli choose first: `import kv.tools.cli` runs kv/__init__.py before kv/tools/cli.py.
    assert _fresh("import sys, kv; print('grpc' in sys.modules)") == "False"
    # The lazy names still resolve.
    assert _fresh("from kv import Client, NotLeaderError; print(Client.__name__, NotLeaderError.__name__)") \
        == "Client NotLeaderError"


def test_the_cli_chooses_the_polling_io_manager_before_grpc_is_imported() -> None:
    out = _fresh("import os, kv.tools.cli; print(kv.tools.cli.POLLING_IO_CHOSEN, os.environ['GRPC_EXPERIMENTS'])")
    assert out == f"True {POLLING_IO_MANAGER}"


def test_the_operators_grpc_experiments_win() -> None:
    out = _fresh("import os, kv.tools.cli; print(os.environ['GRPC_EXPERIMENTS'])", GRPC_EXPERIMENTS="")
    assert out == ""


def test_too_late_once_grpc_is_imported() -> None:
    import grpc  # noqa: F401  (the situation under test)

    environ: dict[str, str] = {}
    assert prefer_polling_io_manager(environ) is False
    assert environ == {}
