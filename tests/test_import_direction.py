"""Dependencies point one way.

- No import cycle between the project's modules (module-level imports; imports inside a
  function are deliberate late bindings, e.g. the CLI choosing a subcommand).
- The router's modules import no torch (a router has no model): only the colocated backend,
  which runs an engine in the router's process, may.
- The block manager and the scheduler import no torch; the control plane imports no torch;
  kv_transfer imports no model code.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "engine",
    "kernels",
    "kv_transfer",
    "router",
    "control_plane",
    "prefill_service",
    "decode_service",
    "pdserve",
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _module_imports() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                if t in modules and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def test_no_import_cycles() -> None:
    graph = _module_imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            # A package importing its own submodules at the top is not a cycle to break.
            if len(component) > 1 and not _package_and_children(component):
                cycles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _package_and_children(component: list[str]) -> bool:
    shortest = min(component, key=len)
    return all(c == shortest or c.startswith(shortest + ".") for c in component)


def _imports_torch(modules: list[str]) -> list[str]:
    code = (
        "import importlib, sys\n"
        "bad = []\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "    if 'torch' in sys.modules:\n"
        "        bad.append(m); break\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


def _modules_of(package: str, exclude: tuple[str, ...] = ()) -> list[str]:
    return sorted(
        _module_name(p) for p in (ROOT / package).rglob("*.py") if _module_name(p) not in exclude
    )


@pytest.mark.parametrize(
    "modules",
    [
        pytest.param(_modules_of("router", exclude=("router.local_backend",)), id="router"),
        pytest.param(_modules_of("control_plane"), id="control_plane"),
        pytest.param(["engine.block_manager", "engine.scheduler"], id="scheduler"),
        pytest.param(["pdserve.wire", "pdserve.options", "pdserve"], id="pdserve-leaves"),
    ],
)
def test_these_modules_import_no_torch(modules: list[str]) -> None:
    assert _imports_torch(modules) == [], "imports torch"


def test_kv_transfer_imports_no_model_code() -> None:
    model_code = (
        "engine.models",
        "engine.model_runner",
        "engine.llm_engine",
        "engine.model_loader",
        "engine.attention",
    )
    graph = _module_imports()
    for name, deps in graph.items():
        if name.startswith("kv_transfer"):
            bad = [d for d in deps if d.startswith(model_code)]
            assert not bad, f"{name} imports model code: {bad}"
