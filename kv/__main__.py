"""`python -m kv ...` is the `raftkv` command."""
from kv.tools.cli import main

raise SystemExit(main())
