"""A space as it was when a test's random sample was drawn, so that the test keeps that sample.

A seeded `Space.sample` draws every parameter, so a parameter added since (or a choice added to one) changes
every later draw and would replace the whole sample the test's tolerances and register models were checked
on. `space_as_it_was` rebuilds the space from today's YAML without them: an added parameter is dropped (its
default is what the kernels of before did), or held as a constant where expressions read it; added choices
leave their parameter, and the named configs that use any of it leave the space. `draw` then samples it as
the sampler did then (a million rejection draws) and returns configs of today's space (the added parameters
at their defaults).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from autotile.codegen import kernels
from autotile.codegen.resources import search_space_path
from autotile.codegen.space import Config, Problem, Space

# MATH=skinny (issue 28) added THREADS_K and STEPS, which only it activates, and tiles under 16.
# wgmma_direct's own knobs (PINGPONG came after the others) are constants (their defaults) there too.
# NARROW_COPIES (half-vector copies on the mma.sync kernels, issue 28) came after all of them, and REALIGN
# (their realigned copies) after that.
SKINNY_CONSTANTS = ("THREADS_K", "STEPS", "CLUSTER_M", "PERSISTENT", "STORE", "PINGPONG", "NARROW_COPIES",
                    "REALIGN")
# MATH=wgmma_direct (issue 30, the 16-bit types) came after skinny, with STAGES of 5 and 6, and int8's K step of
# 128 after it; MATH=mma (the 16-bit types on mma.sync) after those.
DIRECT_CHOICES = {"MATH": ("wgmma_direct", "mma"), "STAGES": (5, 6), "BK": (128,)}
# PRODUCERS=4 (wgmma's four producer warpgroups, issue 28) came after all of them, and VEC=8 (16-byte loads of
# the 16-bit skinny kernels, issue 28) after that.
SKINNY_CHOICES = {"MATH": ("skinny", *DIRECT_CHOICES["MATH"]), "BM": (1, 2, 4, 8), "BN": (4, 8),
                  "STAGES": DIRECT_CHOICES["STAGES"], "BK": DIRECT_CHOICES["BK"], "PRODUCERS": (4,), "VEC": (8,)}


def space_as_it_was(kernel: str, *, dropped: Sequence[str] = (), constants: Sequence[str] = (),
                    added_choices: Mapping[str, Sequence[Any]] | None = None,
                    active: Mapping[str, str] | None = None) -> Space:
    """`kernel`'s space without the parameters `dropped`, with `constants` folded into its expressions as
    their defaults, without `added_choices`, and with the `active` conditions given (as they read then)."""
    added_choices = added_choices or {}
    data = yaml.safe_load(search_space_path(kernel).read_text())
    for name in dropped:
        data["params"].pop(name, None)
    # A constraint that names a dropped parameter came with it or later (about choices added since): out.
    data["constraints"] = [c for c in data["constraints"]
                           if not any(re.search(rf"\b{name}\b", c["expr"]) for name in dropped)]
    for name in constants:
        default = data["params"].pop(name)["default"]
        value = repr(default) if isinstance(default, str) else str(default)  # as the expressions spell it
        word = re.compile(rf"\b{name}\b")
        data["derived"] = {k: word.sub(value, v) for k, v in data["derived"].items()}
        for constraint in data["constraints"]:
            constraint["expr"] = word.sub(value, constraint["expr"])
    for name, condition in (active or {}).items():
        data["params"][name]["active"] = condition
    for name, added in added_choices.items():
        if name in data["params"]:
            data["params"][name]["choices"] = [c for c in data["params"][name]["choices"] if c not in added]
    data["configs"] = {n: c for n, c in data["configs"].items()
                       if not set(c) & {*dropped, *constants}
                       and not any(c.get(k) in v for k, v in added_choices.items())}
    if isinstance(data.get("default"), dict):  # defaults that left with their configs leave the lists too
        data["default"] = {layout: [n for n in names if n in data["configs"]]
                           for layout, names in data["default"].items()}
    return Space(data, f"{kernel} space as it was sampled")


def draw(kernel: str, space: Space, problem: Problem, n: int, seed: int) -> list[Config]:
    """`n` configs of `space` (a `space_as_it_was`) drawn as the sampler drew them then (rejection, up to a
    million draws), as configs of today's space."""
    today = kernels.get(kernel).space
    return [today.config(dict(c)) for c in space.sample(problem, n, seed=seed, max_draws=1_000_000)]


@functools.lru_cache(maxsize=1)
def _before_skinny() -> Space:
    """The matmul space before MATH=skinny, built once (half a second: its YAML is parsed again): a space does
    not change once built, and the draws only read it."""
    return space_as_it_was("matmul", constants=SKINNY_CONSTANTS, added_choices=SKINNY_CHOICES)


def sample_before_skinny(restrict: dict, problem: Problem, n: int, seed: int) -> list[Config]:
    """`n` matmul configs drawn as the space before MATH=skinny drew them, restricted by `restrict`."""
    return draw("matmul", _before_skinny().restricted(restrict), problem, n, seed)
