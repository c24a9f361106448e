"""`python -m kv.bench ...` runs `raftkv bench ...`."""
from kv.bench.cli import main

raise SystemExit(main())
