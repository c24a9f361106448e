"""The import arrows point one way: kv -> raft / statemachine / snapshot -> raftkv_proto, and
raft/core imports nothing of the project but itself (it must stay pure for the simulator). Read
from the source with `ast`, function-level imports included."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kv", "raft", "statemachine", "snapshot", "raftkv_proto")

# package prefix of the importing module -> project packages it may import (prefix match)
ALLOWED: dict[str, tuple[str, ...]] = {
    "raftkv_proto": ("raftkv_proto",),
    "raft.core": ("raft.core",),
    "raft": ("raft", "raftkv_proto"),
    "statemachine": ("statemachine", "raft.core", "raftkv_proto"),
    "snapshot": ("snapshot",),
    "kv.errors": ("raftkv_proto",),
    "kv.client": ("kv.client", "kv.errors", "raftkv_proto"),
    "kv.server": ("kv.server", "kv.client", "kv.errors", "raft", "statemachine", "snapshot", "raftkv_proto"),
    "kv.embedded": ("kv.server", "kv.client", "kv.errors", "raft.node", "raftkv_proto"),
    "kv.tools": PACKAGES,
    "kv": ("kv",),  # kv/__init__.py and __main__.py
}
# The operator's snapshot methods of kv.Client work on files with the snapshot package and lay
# out a data directory with the server's restore; they import them when called, so the client's
# data path imports only the protocol.
EXCEPTIONS = {
    ("kv.client.maintenance", "snapshot.transfer"),
    ("kv.client.maintenance", "snapshot.inspection"),
    ("kv.client.maintenance", "kv.server.restore"),
}


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT / "proto") if path.is_relative_to(ROOT / "proto") else path.relative_to(ROOT)
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from kv import errors` imports kv.errors: name what was imported, module or not.
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in PACKAGES)
    return found


def sources() -> list[Path]:
    files = [p for pkg in ("kv", "raft", "statemachine", "snapshot") for p in (ROOT / pkg).rglob("*.py")]
    files += [p for p in (ROOT / "proto" / "raftkv_proto").glob("*.py") if "_pb2" not in p.name]
    return sorted(files)


def rule_for(module: str) -> tuple[str, ...]:
    prefix = max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)
    return ALLOWED[prefix]


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_source_module_has_a_rule() -> None:
    assert len(sources()) > 50
    for path in sources():
        rule_for(module_name(path))  # raises ValueError (max of nothing) for a module with no rule


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_one_way(path: Path) -> None:
    module = module_name(path)
    allowed = rule_for(module)
    wrong = sorted(name for name in project_imports(path)
                   if not under(name, allowed) and not any(module == m and under(name, (n,)) for m, n in EXCEPTIONS))
    assert not wrong, f"{module} imports {wrong}; it may import only {allowed}"


def test_the_rules_bite() -> None:
    """A core module importing the driver, or the client importing the state machine, is caught."""
    assert not under("raft.node.node", rule_for("raft.core.raft"))
    assert not under("statemachine.commands", rule_for("kv.client.client"))
    assert under("raft.core.types", rule_for("statemachine.kv_state"))
