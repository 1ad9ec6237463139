"""The matmul space as it was before MATH=skinny, for tests whose random samples were drawn from it.

MATH=skinny added the parameters THREADS_K and STEPS and tiles under 16 (BM 1-8, BN 4 and 8). A seeded
sample draws every parameter, so any new one changes every later draw; these tests keep the configs their
register models and tolerances were checked on by drawing from the space as it was, then completing each
config with today's defaults (`today.config`).
"""

from __future__ import annotations

import re

import yaml

from autotile.codegen import kernels
from autotile.codegen.resources import search_space_path
from autotile.codegen.space import Config, Problem, Space

ADDED_PARAMS = ("THREADS_K", "STEPS")  # constants (their defaults) in the space as it was
ADDED_CHOICES = {"MATH": ("skinny",), "BM": (1, 2, 4, 8), "BN": (4, 8)}


def matmul_before_skinny() -> Space:
    data = yaml.safe_load(search_space_path("matmul").read_text())
    for name in ADDED_PARAMS:
        value = str(data["params"].pop(name)["default"])
        word = re.compile(rf"\b{name}\b")
        data["derived"] = {k: word.sub(value, v) for k, v in data["derived"].items()}
        for constraint in data["constraints"]:
            constraint["expr"] = word.sub(value, constraint["expr"])
    for name, added in ADDED_CHOICES.items():
        data["params"][name]["choices"] = [c for c in data["params"][name]["choices"] if c not in added]
    data["configs"] = {n: c for n, c in data["configs"].items() if c.get("MATH") != "skinny"}
    return Space(data, "matmul space before MATH=skinny")


def sample_before_skinny(restrict: dict, problem: Problem, n: int, seed: int) -> list[Config]:
    """`n` configs drawn as the space before MATH=skinny drew them (restricted by `restrict`; rejection
    sampling up to the million draws its sampler then allowed), as configs of today's space."""
    today = kernels.get("matmul").space
    drawn = matmul_before_skinny().restricted(restrict).sample(problem, n, seed=seed, max_draws=1_000_000)
    return [today.config(dict(c)) for c in drawn]
