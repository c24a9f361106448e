"""Which of gRPC's I/O managers raftkv's own processes run on.

grpcio 1.85 moves socket I/O onto its EventEngine threads by default. For Python that costs one
more thread hop, and a GIL handoff, on every message in each direction: the EventEngine thread
reads the socket, then the completion queue's poller thread wakes the asyncio loop. The polling
I/O manager reads the socket on the thread that polls the completion queue, so one hop goes. On
this project's bench machine that makes a single client's linearizable get 20-30% faster and a
put 10-15% faster (README, "Performance").

gRPC reads its experiments once, when the `grpc` module is first imported, so the choice must be
made before that: `kv/tools/cli.py` makes it before anything imports grpc, and `kv/__init__.py` imports
the client lazily so that `import kv.tools.cli` does not import grpc first. A process that embeds
raftkv (`kv.Client`, or a node in its own service) keeps whatever its owner chose; it can opt in
by exporting GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener before it starts.
"""
from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

GRPC_EXPERIMENTS_VAR = "GRPC_EXPERIMENTS"
# gRPC's experiment names; a leading "-" turns an experiment that is on by default off.
POLLING_IO_MANAGER = "-event_engine_client,-event_engine_listener"


def prefer_polling_io_manager(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Ask gRPC for its polling I/O manager, unless GRPC_EXPERIMENTS is already set (the
    operator's choice wins). Child processes inherit the choice. False when it is too late to
    choose because grpc is already imported."""
    if "grpc" in sys.modules:
        return False
    environ.setdefault(GRPC_EXPERIMENTS_VAR, POLLING_IO_MANAGER)
    return True
