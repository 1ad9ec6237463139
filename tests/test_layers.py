"""The package's layers hold: every import (function-local and TYPE_CHECKING ones too) points down or
stays in its own package, packages of one layer never import each other, and no module imports itself
back through a cycle. The layers are declared once, in `autotile/layers.py`. No GPU."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from autotile.layers import layer_of

PACKAGE = Path(__file__).resolve().parents[1] / "autotile"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _resolve(module: str, name: str | None) -> str:
    """The module an import names: `from P import name` is the submodule P.name where there is one."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


def imports_of(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported autotile module, line) for every import in `module`'s source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "autotile"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.split(".")[0] == "autotile":
                edges += [(_resolve(base, a.name), node.lineno) for a in node.names]
    return [(target, line) for target, line in edges if target != module]


GRAPH = {module: imports_of(module, path) for module, path in MODULES.items()}


def test_every_module_is_in_a_declared_layer():
    for module in MODULES:
        layer_of(module)  # raises, naming the module


def against_layers() -> list[str]:
    """Every import that points to a higher layer or across to a sibling package, as 'file:line: edge'."""
    bad = []
    for module, edges in GRAPH.items():
        here, home = layer_of(module)
        for target, line in edges:
            there, package = layer_of(target)
            if there > here or (there == here and package != home):
                bad.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {module} -> {target} "
                           f"({home} may not import {package})")
    return bad


def test_no_import_points_up_or_across():
    bad = against_layers()
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def _cycle() -> list[str] | None:
    """One import cycle (modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target, _ in GRAPH.get(module, []):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycle():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checks_catch_what_they_look_for():
    # The checkers themselves: an upward edge, an edge across siblings and a cycle, planted in the graph.
    planted = [("autotile.codegen.expr", "autotile.tuning.tuner"), ("autotile.library.plan", "autotile.tuning.tuner"),
               ("autotile.errors", "autotile.codegen.expr")]
    for source, target in planted:
        GRAPH[source].append((target, 0))
    try:
        bad = against_layers()
        assert any("autotile.codegen.expr -> autotile.tuning.tuner" in b for b in bad)
        assert any("autotile.library may not import autotile.tuning" in b for b in bad)
        assert _cycle() is not None  # errors -> expr -> errors
    finally:
        for source, _ in planted:
            GRAPH[source].pop()


def test_a_library_call_loads_no_tuner():
    # `import autotile` and the modules a call runs through load neither optuna nor the tuning layer.
    code = ("import sys, autotile, autotile.library.calls, autotile.library.api, autotile.dispatch.select\n"
            "loaded = sorted(m for m in sys.modules\n"
            "                if m.split('.')[0] == 'optuna' or m.startswith('autotile.tuning'))\n"
            "print(','.join(loaded))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""
