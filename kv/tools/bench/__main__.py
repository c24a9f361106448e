"""`python -m kv.tools.bench ...` runs `raftkv bench ...`, on the same gRPC I/O manager as `raftkv`."""
from kv.tools.grpc_io import prefer_polling_io_manager

prefer_polling_io_manager()

from kv.tools.bench.cli import main  # noqa: E402  (after the gRPC runtime choice)

raise SystemExit(main())
