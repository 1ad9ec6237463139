"""Warm starts for a search: the winners the cache holds for other shapes and other GPUs of the same kernel,
dtype and layout, projected onto the space being searched, run right after the seeds and named configs.

Why: a tuned config rarely stays the best from one shape to the next, but it lands in the right region (tile
sizes that fill the GPU, the loads the layout wants), which TPE otherwise spends its first draws finding.
The record of the very problem on this device is left out: that is the config in use, which a re-tune
already runs as a starting point (`TuneOptions.start`), and in the search benchmark it would be the answer.
"""

from __future__ import annotations

import contextlib
from typing import Any

from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Config, Problem, Space
from autotile.errors import AutotileError
from autotile.tuning.propose import settle

WARM_STARTS = 4  # configs taken from the cache, at most (each costs one trial)


def project(space: Space, values: dict[str, Any]) -> Config | None:
    """`values` (a config of the full space) as a config of `space`: a parameter `space` fixes to one value
    takes it, a parameter `values` lacks takes its first choice; None where a value is outside a parameter
    that `space` lets vary (that config lies outside the space)."""
    out: dict[str, Any] = {}
    for name, param in space.params.items():
        value = values.get(name, param.choices[0])
        if len(param.choices) == 1:
            value = param.choices[0]
        out[name] = value
    try:
        return settle(space, space.config(out))
    except AutotileError:
        return None


def _from_records(key: ProblemKey, device: str, cache: Any) -> list[tuple[str, dict[str, Any]]]:
    """The cache's records of `key`'s kernel, dtype and layout as (where, config values): this device's
    first, then other devices', nearer shapes first; the record of `key` itself on `device` left out."""
    from autotile.dispatch.select import log_distance

    records = []
    with contextlib.suppress(OSError, AutotileError):
        records = [r for _, r in cache.entries(include_shipped=True)]
    mine = [r for r in records if (r.kernel, r.dtype, r.layout) == (key.kernel, key.dtype, key.layout)
            and len(r.shape) == len(key.shape) and not (r.device == device and tuple(r.shape) == tuple(key.shape))]
    mine.sort(key=lambda r: (r.device != device, log_distance(r.shape, key.shape), r.device))
    return [(f"{'x'.join(map(str, r.shape))}@{r.device}", r.config) for r in mine]


def _from_portfolio(key: ProblemKey, device: DeviceLimits, cache: Any) -> list[tuple[str, dict[str, Any]]]:
    """The candidates of this device's shape database, or a sibling GPU's (`autotile.dispatch.database.find`:
    the dispatch portfolio), as (where, config), best first as the selection model predicts them for `key`'s
    shape (`Model.rank`: their speed-ups on the nearest database shapes), `key`'s own shape and its survey
    record left out."""
    from autotile.dispatch import database
    from autotile.dispatch.model import model_for, params_of

    db = None
    with contextlib.suppress(OSError, AutotileError):
        db = database.find(cache, device.fingerprint, key.kernel, key.dtype, key.layout)
    if db is None or not db.covers(key.shape) or any(len(s) != len(key.shape) for s in db.shapes):
        return []
    shape = "x".join(map(str, key.shape))
    own = "tuned-" + shape  # the survey's copy of `key`'s own record: left out
    ranked = model_for(db, device).rank(key.shape, params_of(db), held_out=True)
    return [(f"portfolio {db.candidates[j].name} for {shape}@{db.device}", db.candidates[j].config or {})
            for j in ranked if db.candidates[j].config is not None and db.candidates[j].name != own]


def warm_starts(key: ProblemKey, device: str, space: Space, problem: Problem, cache: Any,
                limit: int = WARM_STARTS) -> list[tuple[str, Config]]:
    """Up to `limit` distinct feasible configs, as (where it came from, config), taken in turn from the
    dispatch portfolio (best predicted for the shape first) and from the cache's records of other shapes
    and GPUs (`_from_portfolio`, `_from_records`)."""
    sources = [_from_portfolio(key, problem.device, cache), _from_records(key, device, cache)]
    found: list[tuple[str, Config]] = []
    seen: set[str] = set()
    while len(found) < limit and any(sources):
        for source in sources:
            while source:
                where, values = source.pop(0)
                config = project(space, values)
                if config is not None and config.key() not in seen and space.is_feasible(config, problem):
                    seen.add(config.key())
                    found.append((where, config))
                    break
            if len(found) >= limit:
                break
    return found


__all__ = ["WARM_STARTS", "project", "warm_starts"]
