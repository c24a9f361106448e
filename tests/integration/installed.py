"""What a test needs installed beyond the project (a client from PyPI, a program from Debian):
skipped, with what is missing, on a developer's machine that lacks it; a failure under CI
(CI=true), which installs all of it (.ci/run, pyproject's `test` extra)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest


def require(missing: str | None) -> None:
    """Skip (or under CI fail) with `missing`, the reason, unless it is None."""
    if missing is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{missing}; CI installs it: not skipped")
    pytest.skip(missing)


def module_missing(module: str, package: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return f"{package} is not installed (pip install -e '.[test]')"
    return None


def program_missing(paths: tuple[Path, ...], packages: str) -> str | None:
    for path in paths:
        if not path.exists():
            return f"{path} is not installed (Debian: apt-get install {packages})"
    return None
