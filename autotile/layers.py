"""The layers of the package, bottom to top: the one place they are declared.

A module may import from its own layer's package and from any layer below it, never from one above; the
packages that share a layer (tuning and library) never import each other. `tests/test_layers.py` reads
every module's imports (function-local ones too) and fails on an upward import or a cycle, naming the edge.
docs/architecture.md draws the same picture.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, ...], ...] = (
    # foundation: the exceptions, the version and this declaration
    ("autotile.errors", "autotile.version", "autotile.layers"),
    # the environment's switches (one parser of boolean variables)
    ("autotile.environment",),
    # reading users' files within limits (regular files, a size cap, bounded YAML and JSON)
    ("autotile.safe_files",),
    # spaces, expressions, device limits, problem keys, templates' rendering, compiling, kernel specs
    ("autotile.codegen",),
    # live GPUs, operands of CuPy and torch, implementations (generated kernels, cuBLAS), timing, the worker
    ("autotile.runtime",),
    # tuned records (cache), shape database, selection model and policy, precision, first-call switch
    ("autotile.dispatch",),
    # the tuner and everything around it | the library's calls and torch operators: siblings
    ("autotile.tuning", "autotile.library"),
    # the commands, the benchmarks
    ("autotile.cli",),
    # the package's faces: `import autotile`, `import autotile.torch`, `python -m autotile`
    ("autotile", "autotile.torch", "autotile.__main__"),
)


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the declared package or module) that `module` belongs to: the longest declared prefix."""
    best: tuple[int, str] | None = None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (index, name)
    if best is None:
        raise KeyError(f"{module} is in no declared layer (autotile/layers.py)")
    return best


__all__ = ["LAYERS", "layer_of"]
