"""The package layout is the architecture: imports run down the stack only.

Every import of every vfsd module is read from its source (lazy imports inside
functions included) and checked against the layers the README's architecture
section lists. A second check imports the daemon in a fresh interpreter and
looks at what it loaded.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "vfsd"

# Lowest first. A module may import its own package and anything of a lower
# rank; two packages of the same rank never import each other. Top-level
# modules of one rank form one group.
LAYERS: dict[str, int] = {
    "vfsd": 0, "vfsd.errors": 0, "vfsd.logs": 0, "vfsd.notify": 0, "vfsd.rundir": 0,
    "vfsd.latency": 0, "vfsd.steps": 0, "vfsd.stalls": 0,
    "vfsd.store": 1,
    "vfsd.snapshots": 2,
    "vfsd.remote": 3, "vfsd.fuse": 3,
    "vfsd.config": 4, "vfsd.eviction": 4, "vfsd.status": 4, "vfsd.metrics": 4, "vfsd.fsck": 4,
    "vfsd.fileinfo": 4, "vfsd.timeline": 4, "vfsd.evictrules": 4, "vfsd.evictscope": 4,
    "vfsd.control": 5,
    "vfsd.daemon": 6, "vfsd.serve": 6, "vfsd.volume": 6, "vfsd.shard": 6, "vfsd.replicas": 6,
    "vfsd.cli": 7, "vfsd.demo": 7,
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The vfsd modules `name` imports, anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "vfsd")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "vfsd":
                mod = node.module
            else:
                continue
            found.add(mod)
            for a in node.names:  # `from vfsd.store import content` names a module
                if f"{mod}.{a.name}" in known:
                    found.add(f"{mod}.{a.name}")
    return {f for f in found if f in known and f != name}


def group(mod: str) -> str:
    """The layer entry a module belongs to: its package, or itself at top level."""
    parts = mod.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    raise KeyError(mod)


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if m != "vfsd" and group(m) == "vfsd"]
    assert unplaced == [], f"add these to the README's layers and to LAYERS: {unplaced}"


def is_top_level(g: str) -> bool:
    return g.count(".") == 1 and not (PKG / g.split(".")[1]).is_dir()


def test_imports_run_down_the_stack():
    bad = []
    for mod, deps in graph().items():
        g = group(mod)
        for dep in deps:
            d = group(dep)
            if d == "vfsd" or d == g:
                continue
            if LAYERS[d] == LAYERS[g] and is_top_level(d) and is_top_level(g):
                continue  # top-level modules of one rank are one group
            if LAYERS[d] >= LAYERS[g]:
                bad.append(f"{mod} imports {dep}")
    assert bad == []


def test_no_import_cycles():
    deps = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for d in sorted(deps[m]):
            if state.get(d) == 1:
                cycles.append(trail[trail.index(d):] + [d] if d in trail else [m, d])
            elif d not in state:
                visit(d, trail + [d])
        state[m] = 2

    for m in sorted(deps):
        if m not in state:
            visit(m, [m])
    # A package's __init__ importing its own modules is not a cycle worth a name.
    cycles = [c for c in cycles if not any(modules()[x].name == "__init__.py" for x in c)]
    assert cycles == []


def loaded_by(stmt: str) -> set[str]:
    code = f"import json, sys; {stmt}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PKG.parent).stdout
    return {m for m in json.loads(out) if m.split(".")[0] == "vfsd"}


@pytest.mark.parametrize("stmt, never", [
    ("import vfsd.daemon", ["vfsd.cli", "vfsd.demo"]),
    ("import vfsd.fuse.fs", ["vfsd.remote", "vfsd.control", "vfsd.daemon", "vfsd.cli"]),
    ("import vfsd.snapshots.snapshots", ["vfsd.fuse", "vfsd.remote", "vfsd.control"]),
    ("import vfsd.store.store", ["vfsd.snapshots", "vfsd.fuse", "vfsd.remote", "vfsd.control",
                                 "vfsd.config"]),
    ("import vfsd.control.client", ["vfsd.store", "vfsd.fuse", "vfsd.remote", "vfsd.daemon"]),
    # The CLI imports the lower layers inside the verbs that need them.
    ("import vfsd.cli", ["vfsd.store", "vfsd.snapshots", "vfsd.fuse", "vfsd.remote",
                         "vfsd.daemon", "vfsd.fsck", "vfsd.status"]),
])
def test_importing_a_layer_loads_nothing_above_it(stmt, never):
    loaded = loaded_by(stmt)
    above = sorted(m for m in loaded for n in never if m == n or m.startswith(n + "."))
    assert above == []


def third_party_loaded_by(stmt: str) -> set[str]:
    # (A None in sys.modules is an import refused on purpose, nothing loaded.)
    code = (f"import json, sys; {stmt}; "
            "print(json.dumps(sorted(m for m, v in sys.modules.items() if v is not None)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PKG.parent).stdout
    return {m.split(".")[0] for m in json.loads(out)}


@pytest.mark.parametrize("stmt, allowed", [
    ("import vfsd.serve, vfsd.control.server", set()),
    # The spawner's pages are shared with every daemon it forks.
    ("import vfsd.cli.spawner", {"click"}),
])
def test_a_daemon_loads_only_what_it_serves_with(stmt, allowed):
    # Every module a daemon loads is memory in every mount (and time in every
    # start): the object-store client, the metrics server, the console
    # renderers and the command line stay out of a daemon without them.
    loaded = third_party_loaded_by(stmt)
    assert {"trio", "pyfuse3", "lmdb", "structlog"} <= loaded
    unwanted = {"boto3", "botocore", "urllib3", "s3transfer", "prometheus_client", "rich",
                "pygments", "click", "argparse", "tomllib"} - allowed
    assert sorted(loaded & unwanted) == []


def test_mount_tool_imports_nothing_of_vfsd():
    root = PKG.parent / "mount_tool"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not [n for n in names if n.split(".")[0] == "vfsd"], path
