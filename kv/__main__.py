"""`python -m kv ...` is the `raftkv` command."""
from kv.cli import main

raise SystemExit(main())
