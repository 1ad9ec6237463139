"""Proposals the tuner makes itself, without asking optuna's sampler: a feasible config drawn uniformly (a
kernel family first, then a config of it), the nearest feasible, unmeasured neighbour of a config, and a
config's K split fitted to the GPU's SMs (`filled`).

Why: the spaces are all-categorical and conditional. optuna draws a conditional space branch by branch,
so `smem=none` (the naive kernel, where most parameters are inactive: a handful of configs) gets a third
of all random draws; drawing uniformly over the *feasible configs* gives each config the same chance
within a kernel family, and each family (SIMT, tf32x3, wgmma: thousands to millions of configs) the same
chance of being drawn.
And a converged TPE keeps proposing configs already measured (tens of asks per new config, each costing
time in proportion to the study's size): after such a repeat, or an infeasible draw, the tuner runs the
nearest unmeasured neighbour instead, which is what the sampler was pointing at, for no sampler cost.

And TPE alone stalls short of the optimum on the recorded sweeps (its median at 100 trials was 0.981-0.989
of the optimum on four of them): its model ranks regions, not the last few percent inside the best one. So
part of the default search's budget goes to `improvement`: an unmeasured config one parameter away from one
of the fastest measured so far (a first-improvement local search, the fastest config's neighbourhood
first).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Container, Sequence
from typing import Any, TypeVar

from autotile.codegen.space import Config, Problem, Space
from autotile.dispatch import precision as precision_mod

MAX_DRAWS = 200_000  # rejection-sampling draws before a space is taken as exhausted
# A space so narrowed (`--fix MATH=wgmma`: 780 feasible configs among billions of raw draws) that rejection
# sampling finds nothing in this many draws is enumerated instead, if it has at most ENUMERATE_LIMIT
# feasible configs (the full matmul space has 3.9 million and takes half a minute to walk).
SPARSE_DRAWS = 20_000
ENUMERATE_LIMIT = 100_000
FILL = 0.9  # `filled`: a launch with blocks for this share of the SMs fills the GPU (128 of an H100's 132)
CONTROL_COMBOS = 10_000  # settings of the deciding parameters walked to find a space's smallest weight
# What is worked out once per space (and problem) in a process: (what, id(space), problem) -> (space, value).
# The space is kept alongside its id, so that a new space that reuses a freed id is not taken for it.
_memo: dict[tuple[str, int, Problem | None], tuple[Space, Any]] = {}
_ABSENT = object()
T = TypeVar("T")


def _once(what: str, space: Space, problem: Problem | None, make: Callable[[], T]) -> T:
    """`make()` for this space and problem, computed on the first call only."""
    known = _memo.get((what, id(space), problem))
    if known is None or known[0] is not space:
        known = _memo[(what, id(space), problem)] = (space, make())
    value: T = known[1]
    return value


def _computed(what: str, space: Space, problem: Problem | None) -> Any:
    """What `_once` computed for this space and problem, or _ABSENT where it has not yet."""
    known = _memo.get((what, id(space), problem))
    return known[1] if known is not None and known[0] is space else _ABSENT


def _feasible_if_few(space: Space, problem: Problem) -> list[Config] | None:
    """Every feasible config of a sparse space (at most ENUMERATE_LIMIT), else None; walked once."""
    def walk() -> list[Config] | None:
        configs = space.feasible(problem, limit=ENUMERATE_LIMIT + 1)
        return configs if len(configs) <= ENUMERATE_LIMIT else None

    return _once("feasible if few", space, problem, walk)


def uniform(space: Space, problem: Problem, rng: random.Random, taken: Container[str],
            max_draws: int = MAX_DRAWS) -> Config | None:
    """A feasible config not in `taken` (config keys): a kernel family (a value of the space's MATH
    parameter: SIMT, tf32x3 mma.sync, wgmma...) drawn first, each family with a feasible config left equally
    likely, then a config of that family, each equally likely (`uniform_in`). None where no family has one.

    Why families first: the families differ in size by orders of magnitude (the SIMT kernels are most of
    the float32 matmul space's millions of configs, the wgmma kernels a few thousand), and the fastest
    family depends on the shape; drawing configs uniformly over the whole space would almost never try
    the small families."""
    for sub in _families(space, rng):
        if not _any_feasible(sub, problem):
            continue  # wgmma on an A100, float64's DMMA for float32: never drawn from
        found = uniform_in(sub, problem, rng, taken, max_draws)
        if found is not None:
            return found
    return None


def _any_feasible(space: Space, problem: Problem) -> bool:
    """Whether `space` has a feasible config for `problem` (the walk's first one; milliseconds, memoized)."""
    return _once("any feasible", space, problem, lambda: bool(space.feasible(problem, limit=1)))


def _families(space: Space, rng: random.Random) -> list[Space]:
    """The space narrowed to each of its kernel families (MATH values), in a random order; the space itself
    where it has one family or none."""
    param = space.params.get(precision_mod.MATH_PARAM)
    if param is None or len(param.choices) < 2:
        return [space]
    order = list(_once("families", space, None,
                       lambda: [space.restricted({param.name: [value]}) for value in param.choices]))
    rng.shuffle(order)
    return order


def uniform_in(space: Space, problem: Problem, rng: random.Random, taken: Container[str],
               max_draws: int = MAX_DRAWS) -> Config | None:
    """A feasible config of `space` not in `taken` (config keys), each such config equally likely; None
    where `max_draws` draws found none. A space where SPARSE_DRAWS draws find nothing and that has at most
    ENUMERATE_LIMIT feasible configs is enumerated (once), and the pick made among those: None there means
    every one is taken.

    Every parameter is drawn from its choices, then the config is settled (a parameter that is off takes
    its inactive value). A settled config with inactive parameters is where that many raw draws land (the
    product of their numbers of choices, its weight), so it is kept with probability (the smallest weight
    of the space) / (its weight): each settled config then comes out equally often. Drawing the branch
    first instead would give the naive kernel's handful of configs (`smem=none`) a third of all draws,
    against 0.7% of the feasible matmul configs."""
    floor = _weight_floor(space)
    few = _computed("feasible if few", space, problem)
    if few is not _ABSENT and few is not None:
        return _pick(few, rng, taken)
    params = list(space.params.values())
    for draw in range(max_draws):
        if draw == SPARSE_DRAWS:
            few = _feasible_if_few(space, problem)
            if few is not None:
                return _pick(few, rng, taken)
        values: dict[str, Any] = {}
        weight = 1  # raw draws that settle to this config
        for p in params:
            if p.active is not None and not p.active(values):
                values[p.name] = p.inactive
                weight *= len(p.choices)
            else:
                values[p.name] = rng.choice(p.choices)
        if weight > floor and rng.random() * weight >= floor:
            continue
        config = Config(values)
        if config.key() not in taken and space.is_feasible(config, problem):
            return config
    return None


def _weight_floor(space: Space) -> int:
    """The smallest weight (raw draws per settled config, `uniform_in`) of any branch of `space`: every way
    of setting the parameters that decide which others are active (at most CONTROL_COMBOS of them; past
    that, 1, which keeps the draw uniform, only slower)."""
    def smallest() -> int:
        params = list(space.params.values())
        controls = [p for p in params if any(p.name in q.active.names for q in params if q.active is not None)]
        if math.prod(len(p.choices) for p in controls) > CONTROL_COMBOS:
            return 1
        return min(_branch_weight(params, dict(zip([p.name for p in controls], combo, strict=True)))
                   for combo in itertools.product(*(p.choices for p in controls)))

    return _once("weight floor", space, None, smallest)


def _branch_weight(params: Sequence[Any], controls: dict[str, Any]) -> int:
    """The weight of the branch where the deciding parameters take the values `controls` (the others do not
    change which parameters are active: any of their choices will do)."""
    values: dict[str, Any] = {}
    weight = 1
    for p in params:
        if p.active is not None and not p.active(values):
            values[p.name] = p.inactive
            weight *= len(p.choices)
        else:
            values[p.name] = controls.get(p.name, p.choices[0])
    return weight


def _pick(configs: Sequence[Config], rng: random.Random, taken: Container[str]) -> Config | None:
    """One of `configs` not in `taken`, each equally likely; None where all are taken."""
    left = [c for c in configs if c.key() not in taken]
    return rng.choice(left) if left else None


def neighbour(space: Space, problem: Problem, rng: random.Random, config: Config, taken: Container[str],
              radius: int = 2) -> Config | None:
    """A feasible config not in `taken` that differs from `config` in as few parameters as possible (one,
    else two, up to `radius`), chosen at random among those; None where there is none that close."""
    for distance in range(1, radius + 1):
        found = _at_distance(space, problem, rng, config, taken, distance)
        if found is not None:
            return found
    return None


def _at_distance(space: Space, problem: Problem, rng: random.Random, config: Config, taken: Container[str],
                 distance: int, swaps: bool = False) -> Config | None:
    """A feasible config not in `taken` that differs from `config` in exactly `distance` parameters (before
    settling), or, with `swaps`, by exchanging the values of two parameters of the same choices; chosen at
    random among those; None where there is none."""
    params = [p for p in space.params.values() if len(p.choices) > 1]
    changes = _changes(params, config, distance) + (_swaps(params, config) if swaps else [])
    # The first that passes, in a random order, is a uniform pick among those that pass: only as many
    # feasibility checks as it takes (they dominate the search's own time on the full spaces).
    rng.shuffle(changes)
    # A change of parameters that are all off in a settled `config` settles back to `config` itself: skipped
    # unsettled, after the shuffle, so the draw is the one it was (on the whole matmul space a wgmma config
    # leaves the SIMT and mma.sync parameters off: most of its changes at distance 2).
    off = _inactive(space, config) if settle(space, config) == config else frozenset()
    for changed in changes:
        if off and off.issuperset(changed):
            continue
        candidate = settle(space, Config(dict(config, **changed)))
        if candidate.key() not in taken and candidate != config and space.is_feasible(candidate, problem):
            return candidate
    return None


def filled(space: Space, problem: Problem, kernel: str, shape: tuple[int, ...], config: Config) -> Config | None:
    """`config` with its K split to fill the SMs, where its tiles alone leave more than 1 - FILL of them idle
    (a skinny or small problem, a tall K); None where it has no K split to change (SPLIT_K is not 1, or the
    space has none), fills the GPU already, or no split is feasible and worth timing (`model.worth_timing`:
    enough K per split). Of the splits from the fewest that fill FILL of the SMs to twice as many, the one
    whose waves are fullest for its work (`_wave_cost`), the fewer pieces on a tie; where none fills, the
    largest that is feasible."""
    from autotile.dispatch.model import worth_timing

    param = space.params.get("SPLIT_K")
    if param is None or config.get("SPLIT_K") != 1:
        return None
    sm_count = problem.device.sm_count
    blocks = _blocks(kernel, config, shape)
    if blocks >= FILL * sm_count:
        return None
    usable = []  # (split, config), fewer pieces first
    for split in sorted(int(c) for c in param.choices if int(c) > 1):
        for reduce in _reductions(space):
            candidate = settle(space, Config(dict(config, SPLIT_K=split, **reduce)))
            if space.is_feasible(candidate, problem) and worth_timing(kernel, candidate, shape, sm_count):
                usable.append((split, candidate))
                break
    fewest = next((split for split, _ in usable if blocks * split >= FILL * sm_count), None)
    if fewest is None:
        return usable[-1][1] if usable else None
    near = [(split, c) for split, c in usable if fewest <= split <= 2 * fewest]
    return min(near, key=lambda sc: (_wave_cost(space, problem, sc[1], blocks * sc[0]), sc[0]))[1]


def _blocks(kernel: str, config: Config, shape: tuple[int, ...]) -> int:
    """The blocks `config` launches on `shape`."""
    from autotile.codegen import kernels

    return math.prod(kernels.get(kernel).grid(config, shape))


def _wave_cost(space: Space, problem: Problem, config: Config, blocks: int) -> float:
    """The launch's time in units of one block's work at one split (the time of a split into S pieces is its
    waves of blocks, each block doing 1/S of the K loop): waves / S. A split whose last wave is nearly empty
    costs as much as a full one, which the fewest pieces that fill the SMs often leave (40 tiles on 132 SMs
    split 4 is two waves, the second a fifth full; split 8 is three nearly full, each half as long)."""
    per_wave = problem.device.sm_count * max(1, int(space.derive(config, problem).get("blocks_per_sm", 1)))
    return math.ceil(blocks / per_wave) / config["SPLIT_K"]


def _reductions(space: Space) -> list[dict[str, Any]]:
    """The ways a K split may meet (SPLIT_REDUCE's choices, the default first), or one way to say none."""
    param = space.params.get("SPLIT_REDUCE")
    if param is None:
        return [{}]
    first = [param.default] if param.has_default and param.default in param.choices else []
    return [{param.name: v} for v in first + [c for c in param.choices if c not in first]]


def improvement(space: Space, problem: Problem, rng: random.Random, ranked: Sequence[Config],
                taken: Container[str], top: int = 5,
                moves: Callable[[Config], list[Config]] | None = None) -> Config | None:
    """A feasible, unmeasured config one parameter away from the fastest of `ranked` (measured configs,
    in the order to improve on them) that has one; only the `top` first are tried (beyond them the search
    would walk away from what is known to be good). None where their neighbourhoods are all measured. With
    `moves` (a config -> the neighbours the shape says are worth it first, `shape_moves`), those are tried
    first for each."""
    for config in ranked[:top]:
        for move in moves(config) if moves is not None else ():
            if move.key() not in taken:
                return move
        near = _at_distance(space, problem, rng, config, taken, 1, swaps=True)
        if near is not None:
            return near
    return None


def shape_moves(space: Space, problem: Problem, kernel: str, shape: tuple[int, ...], config: Config) -> list[Config]:
    """The neighbours of `config` that the shape singles out: its K split to fill the GPU (`filled`), else,
    where K is split already, no split where its tiles alone fill the GPU, then the next fewer and the next
    more pieces the space offers (feasible and worth timing). The time of a K split is not monotonic in the
    pieces (the last wave's fill, the reduction's cost), so both sides are tried."""
    from autotile.dispatch.model import worth_timing

    wide = filled(space, problem, kernel, shape, config)
    if wide is not None:
        return [wide]
    param = space.params.get("SPLIT_K")
    if param is None or config.get("SPLIT_K", 1) == 1:
        return []
    out = []
    choices = sorted(int(c) for c in param.choices)  # a fixed SPLIT_K (`--fix`) may leave out 1
    whole = settle(space, Config(dict(config, SPLIT_K=1)))
    if 1 in choices and _blocks(kernel, whole, shape) >= FILL * problem.device.sm_count \
            and space.is_feasible(whole, problem):
        out.append(whole)  # its tiles alone fill the GPU: a split only adds the reduction's work
    i = choices.index(int(config["SPLIT_K"]))
    for step in choices[max(0, i - 1):i] + choices[i + 1:i + 2]:
        candidate = settle(space, Config(dict(config, SPLIT_K=step)))
        if space.is_feasible(candidate, problem) and worth_timing(kernel, candidate, shape, problem.device.sm_count):
            out.append(candidate)
    return out


def _swaps(params: list[Any], config: Config) -> list[dict[str, Any]]:
    """Every exchange of values between two parameters that take the same choices (BM and BN, WM and WN,
    TM and TN: the tile turned on its side). One parameter at a time cannot walk there when the tile's
    shape is tied by a constraint (the warps of a block), and such a transposed tile is often close in time."""
    out = []
    for i, a in enumerate(params):
        for b in params[i + 1:]:
            if list(a.choices) == list(b.choices) and config[a.name] != config[b.name]:
                out.append({a.name: config[b.name], b.name: config[a.name]})
    return out


def _changes(params: list[Any], config: Config, distance: int) -> list[dict[str, Any]]:
    """Every way of changing `distance` of `params` to another of their choices."""
    out: list[dict[str, Any]] = [{}]
    for _ in range(distance):
        grown = []
        for done in out:
            start = max((i for i, p in enumerate(params) if p.name in done), default=-1) + 1
            for p in params[start:]:
                grown += [dict(done, **{p.name: v}) for v in p.choices if v != config[p.name]]
        out = grown
    return out


def _inactive(space: Space, config: Config) -> frozenset[str]:
    """The parameters that are off in `config` (conditional, and their condition false)."""
    return frozenset(p.name for p in space.params.values() if p.active is not None and not p.active(config))


def settle(space: Space, config: Config) -> Config:
    """`config` with each conditional parameter that is off at its inactive value (changing `smem` to none
    turns BK, VEC... off), else the same config could be written several ways."""
    values: dict[str, Any] = {}
    for p in space.params.values():
        values[p.name] = p.inactive if p.active is not None and not p.active(values) else config[p.name]
    return Config(values)


__all__ = ["filled", "improvement", "neighbour", "settle", "shape_moves", "uniform", "uniform_in"]
