"""Compile ahead, on the host, the kernels a first tune or a first call starts with: into the compile cache.

A tune of a new shape first runs the space's named configs and its warm starts (the shape database's
candidates), and the library's first call of a shape runs one of those candidates. On a machine whose
compile cache does not hold them yet, each waits for NVRTC (about a second a kernel, several for the
largest): on an H100 (2026-11-27) a 40-trial tune from an empty compile cache spent 8-30 s of its
11-42 s waiting for compiles. NVRTC needs no GPU, so `autotile cache compile` builds them ahead, for a
live GPU or an offline profile's architecture, on every host core: once after installing, or in an image's
build step. The kernels take their sizes at run time, so one binary serves every shape; a named config
that a tune fits to a shape with a K split (`propose.filled`) is another kernel, compiled when first run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from autotile.codegen import build, compile_cache, dtypes, kernels
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.space import Problem
from autotile.errors import CompileError, InvalidValueError

if TYPE_CHECKING:
    from autotile.dispatch.cache import TuningCache


@dataclasses.dataclass(frozen=True)
class Job:
    """One kernel to compile: where it comes from (a named config, or a shape database's candidate)."""

    kernel: str
    dtype: str
    layout: str
    origin: str  # "named NAME" or "database NAME", then " fitted to SHAPE" for a tune's K split
    source: str
    arch: str


@dataclasses.dataclass
class Summary:
    """What `compile_all` did: kernels compiled, found compiled already, failed (job, first error line)."""

    compiled: int = 0
    cached: int = 0
    failed: list[tuple[Job, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def jobs(limits: DeviceLimits, cache: TuningCache, kernel_names: Iterable[str] | None = None,
         dtype_names: Iterable[str] | None = None, layouts: Iterable[str] | None = None,
         shapes: Iterable[tuple[int, ...]] = ()) -> list[Job]:
    """The kernels to build for a GPU of `limits`: for each kernel, dtype and layout asked for (None: all),
    the space's named configs that are feasible there, then the candidates of the shape database that
    serves the problem family on that GPU (`database.find_first`: its own or a lender's, else a sibling's)
    that the selection model would run there (`model.usable_config`: current and feasible), each source once.
    With `shapes` (each one a kernel's: as many sizes as its dimensions), also each of those configs as a
    tune of that shape runs it, fitted with a K split where its tiles leave SMs idle (`propose.filled`)."""
    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch import database
    from autotile.dispatch.model import usable_config
    from autotile.dispatch.select import database_families
    from autotile.tuning.propose import filled

    cc = limits.compute_capability
    shapes = list(shapes)
    seen: set[str] = set()
    out: list[Job] = []
    for name in kernel_names or kernels.KERNELS:
        spec = kernels.get(name)
        space = spec.space
        for dtype in dtype_names or dtypes.DTYPES:
            for layout in layouts or space.layouts:
                layout = spec.layout(layout)
                problem = Problem(limits, dtype, layout)
                configs = [(f"named {n}", c) for n, c in space.named_configs.items() if space.is_feasible(c, problem)]
                family = ProblemKey(name, dtype, layout, (1,) * len(spec.dims))  # any shape: the family's lenders
                db = database.find_first(cache, limits.fingerprint, database_families(family))
                if db is not None:
                    for cand in db.candidates:
                        usable = usable_config(db, cand, problem)  # what the selection model would run: feasible
                        if usable is not None:
                            configs.append((f"database {cand.name}", usable))
                ours = [shape for shape in shapes if len(shape) == len(spec.dims)]
                for origin, config in configs:
                    variants = [(origin, config)]
                    for shape in ours:
                        fitted = filled(space, problem, name, shape, config)
                        if fitted is not None:
                            variants.append((f"{origin} fitted to {'x'.join(map(str, shape))}", fitted))
                    for where, variant in variants:
                        source = spec.render(variant, dtype, layout)
                        if source in seen:
                            continue
                        seen.add(source)
                        arch = build.target_arch(cc, build.needs_arch_specific(source))
                        out.append(Job(name, dtype, layout, where, source, arch))
    return out


def cache_folder() -> Path:
    """The compile cache's folder, where compiling ahead keeps its kernels; InvalidValueError where it is off."""
    folder = compile_cache.root()
    if folder is None:
        raise InvalidValueError(f"the compile cache is off ({compile_cache.ENV_VAR}={compile_cache.OFF}): "
                                "compiling ahead would keep nothing")
    return folder


def compile_all(todo: list[Job], threads: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> Summary:
    """Compile every job into the compile cache on `threads` NVRTC threads (default: the host's cores, at
    most `build.MAX_COMPILE_THREADS`); one that fails is reported, never stops the others. `progress(done,
    total)` after each."""
    cache_folder()
    build.require_nvrtc()  # one error where NVRTC cannot load, not one per kernel
    summary = Summary()
    started = time.monotonic()
    compiler = build.compiler_version()

    def one(job: Job) -> bool:
        """Compile `job`; True where the cache held it already."""
        key = build.source_hash(job.source, build.nvrtc_options(job.arch))
        if compile_cache.load(key, compiler) is not None:
            return True
        build.compile(job.source, job.arch)
        return False

    with concurrent.futures.ThreadPoolExecutor(threads or build.host_compile_threads()) as pool:
        futures = {pool.submit(one, job): job for job in todo}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            try:
                if future.result():
                    summary.cached += 1
                else:
                    summary.compiled += 1
            except Exception as exc:  # NVRTC's refusal, or anything else: named, and the others go on
                first = (str(exc).strip().splitlines() or [""])[0]
                summary.failed.append((futures[future], first if isinstance(exc, CompileError)
                                       else f"{type(exc).__name__}: {first}"))
            if progress is not None:
                progress(done, len(todo))
    summary.seconds = time.monotonic() - started
    return summary


__all__ = ["Job", "Summary", "cache_folder", "compile_all", "jobs"]
