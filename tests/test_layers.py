"""The package layout is the architecture: imports run down the stack only.

Every import of every vfsd and mount_tool module is read from its source
(lazy imports inside functions included) and checked against the layers the
architecture page (docs/architecture.md) lists, and for import cycles (imports under
`if TYPE_CHECKING:` run only for type checkers: they count for the layers,
not for cycles). A second check imports a layer in a fresh interpreter and
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
MOUNT_TOOL = PKG.parent / "mount_tool"

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

# mount_tool's layers, the same way. Its package `__init__` is the public API
# (it imports the layers it re-exports), so it sits on top, with the modules
# that keep a documented import path working by re-exporting a module's new home.
MOUNT_TOOL_LAYERS: dict[str, int] = {
    "mount_tool.errors": 0, "mount_tool.refs": 0, "mount_tool.paths": 0,
    "mount_tool.beneath": 0, "mount_tool.reserved": 0,
    "mount_tool.daemon": 1, "mount_tool.sandbox": 1,
    "mount_tool.mount": 2,
    "mount_tool.runs": 3,
    "mount_tool.langgraph": 4,
    "mount_tool.deepagents": 5,
    "mount_tool.cli": 6, "mount_tool.demo": 6,
    "mount_tool": 7, **dict.fromkeys(
        ["mount_tool.checkpointer", "mount_tool.boundary", "mount_tool.client",
         "mount_tool.offload", "mount_tool.toolcalls"], 7),
}
#: mount_tool's documented import paths that only re-export a module's new home
MOUNT_TOOL_ALIASES = {
    "mount_tool.checkpointer": "mount_tool.langgraph.checkpointer",
    "mount_tool.boundary": "mount_tool.langgraph.boundary",
    "mount_tool.client": "mount_tool.daemon.client",
    "mount_tool.offload": "mount_tool.deepagents.offload",
    "mount_tool.toolcalls": "mount_tool.daemon.toolcalls",
}

class Stack:
    """One package's modules, their imports and its layers."""

    def __init__(self, pkg: Path, layers: dict[str, int]) -> None:
        self.pkg, self.layers, self.top = pkg, layers, pkg.name
        self.modules = {self.module_name(p): p for p in sorted(pkg.rglob("*.py"))}

    def module_name(self, path: Path) -> str:
        rel = path.relative_to(self.pkg.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        return ".".join(parts)

    def imports_of(self, name: str, *, type_checking: bool = True) -> set[str]:
        """The package's modules `name` imports, anywhere in its source (with
        `type_checking=False`, not counting those under `if TYPE_CHECKING:`).

        `from pkg import a` imports the package only when `a` is no module of
        it: a submodule's import runs its package's `__init__` in any case."""
        path = self.modules[name]
        known = set(self.modules)
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        tree = ast.parse(path.read_text())
        skipped: set[int] = set()
        if not type_checking:
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and _is_type_checking(node.test):
                    skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == self.top)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.split(".")[0] == self.top:
                    mod = node.module
                else:
                    continue
                submodules = {f"{mod}.{a.name}" for a in node.names} & known
                found |= submodules  # `from vfsd.store import content` names a module
                if len(submodules) < len(node.names):
                    found.add(mod)
        return {f for f in found if f in known and f != name}

    def group(self, mod: str) -> str:
        """The layer entry a module belongs to: its package, or itself at top level."""
        parts = mod.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in self.layers:
                return ".".join(parts[:n])
        raise KeyError(mod)

    def graph(self, *, type_checking: bool = True) -> dict[str, set[str]]:
        return {name: self.imports_of(name, type_checking=type_checking)
                for name in self.modules}

    def is_top_level(self, g: str) -> bool:
        return g.count(".") == 1 and not (self.pkg / g.split(".")[1]).is_dir()

    def unplaced(self) -> list[str]:
        return [m for m in self.modules if m != self.top and self.group(m) == self.top]

    def upward_imports(self, *, root_counts: bool) -> list[str]:
        """Imports of a layer at or above the importer's own (`root_counts`:
        the package's `__init__` has a layer of its own; else it is below all)."""
        bad = []
        for mod, deps in self.graph().items():
            g = self.group(mod)
            for dep in deps:
                d = self.group(dep)
                if d == g or (d == self.top and not root_counts):
                    continue
                if self.layers[d] == self.layers[g] and self.is_top_level(d) and \
                        self.is_top_level(g):
                    continue  # top-level modules of one rank are one group
                if self.layers[d] >= self.layers[g]:
                    bad.append(f"{mod} imports {dep}")
        return bad

    def cycles(self, *, init_exempt: bool) -> list[list[str]]:
        """Import cycles at run time (`init_exempt`: not those through a
        package's `__init__`)."""
        deps = self.graph(type_checking=False)
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
        if init_exempt:
            cycles = [c for c in cycles
                      if not any(self.modules[x].name == "__init__.py" for x in c)]
        return cycles


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


VFSD = Stack(PKG, LAYERS)
MOUNT_TOOL_STACK = Stack(MOUNT_TOOL, MOUNT_TOOL_LAYERS)


def test_every_module_has_a_layer():
    assert VFSD.unplaced() == [], \
        f"add these to docs/architecture.md's layers and to LAYERS: {VFSD.unplaced()}"


def test_imports_run_down_the_stack():
    assert VFSD.upward_imports(root_counts=False) == []


def test_no_import_cycles():
    # A package's __init__ importing its own modules is not a cycle worth a name.
    assert VFSD.cycles(init_exempt=True) == []


def test_every_mount_tool_module_has_a_layer():
    assert MOUNT_TOOL_STACK.unplaced() == [], (
        "add these to docs/architecture.md's mount_tool layers and to MOUNT_TOOL_LAYERS: "
        f"{MOUNT_TOOL_STACK.unplaced()}")


def test_mount_tool_imports_run_down_the_stack():
    # The package's __init__ is the public API, on top: nothing inside imports it.
    assert MOUNT_TOOL_STACK.upward_imports(root_counts=True) == []


def test_mount_tool_shared_modules_import_only_errors():
    # Rank 0 is what every part shares: it imports nothing of mount_tool but errors.
    shared = [m for m, rank in MOUNT_TOOL_LAYERS.items() if rank == 0]
    graph = MOUNT_TOOL_STACK.graph()
    assert {m: sorted(graph[m] - {"mount_tool.errors"}) for m in shared} == \
        {m: [] for m in shared}


def test_no_mount_tool_import_cycles():
    # Strict: a module importing a name from its own package's __init__,
    # which imports the module, is a cycle too.
    assert MOUNT_TOOL_STACK.cycles(init_exempt=False) == []


def test_mount_tool_aliases_only_re_export():
    """The documented paths kept as modules (mount_tool.checkpointer, ...)
    define nothing: each re-exports names of its module's new home, the
    same objects."""
    import importlib

    for alias, home in MOUNT_TOOL_ALIASES.items():
        tree = ast.parse(MOUNT_TOOL_STACK.modules[alias].read_text())
        body = tree.body[1:] if ast.get_docstring(tree) else tree.body
        sources = {node.module for node in body if isinstance(node, ast.ImportFrom)}
        others = [ast.dump(node)[:80] for node in body if not isinstance(node, ast.ImportFrom)
                  and not (isinstance(node, ast.Assign) and
                           [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"])]
        assert (sources, others) == ({home.removeprefix("mount_tool.")}, []), alias
        module, target = importlib.import_module(alias), importlib.import_module(home)
        assert module.__all__ and all(getattr(module, n) is getattr(target, n)
                                      for n in module.__all__), alias


def loaded_by(stmt: str, top: str = "vfsd") -> set[str]:
    code = f"import json, sys; {stmt}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PKG.parent).stdout
    return {m for m in json.loads(out) if m.split(".")[0] == top}


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


@pytest.mark.parametrize("stmt, never", [
    # The one-thread Mount and the Runs load neither the sandbox nor an integration.
    ("import mount_tool", ["mount_tool.sandbox", "mount_tool.langgraph", "mount_tool.deepagents",
                           "mount_tool.cli", "mount_tool.demo", "mount_tool.checkpointer"]),
    ("import mount_tool.langgraph", ["mount_tool.deepagents", "mount_tool.sandbox",
                                     "mount_tool.cli", "mount_tool.demo"]),
    ("import mount_tool.sandbox", ["mount_tool.langgraph", "mount_tool.deepagents"]),
])
def test_importing_a_mount_tool_layer_loads_nothing_above_it(stmt, never):
    loaded = loaded_by(stmt, "mount_tool")
    above = sorted(m for m in loaded for n in never if m == n or m.startswith(n + "."))
    assert above == []


@pytest.mark.parametrize("stmt, unwanted", [
    # LangGraph, LangChain and Deep Agents are optional: `import mount_tool` needs none.
    ("import mount_tool", {"langgraph", "langchain", "langchain_core", "deepagents"}),
    ("import mount_tool.langgraph", {"langchain", "deepagents"}),
])
def test_mount_tool_loads_an_integration_library_only_with_its_integration(stmt, unwanted):
    assert sorted(third_party_loaded_by(stmt) & unwanted) == []


def test_mount_tool_imports_nothing_of_vfsd():
    for path in MOUNT_TOOL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not [n for n in names if n.split(".")[0] == "vfsd"], path
