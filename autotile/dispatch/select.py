"""The selection policy: which config the library runs for a problem on a device, and why.

A chain of steps, each of which may answer or pass:

1. ``exact``: a tuned record for this very shape (which may say that cuBLAS runs: it won the tuning);
2. ``model``: the device's shape database (`autotile.dispatch.database`, built by `autotile survey`) and the
   selection model learned from it (`autotile.dispatch.model`): a generated config where the nearest surveyed
   shapes predict it safely faster than cuBLAS, cuBLAS otherwise;
3. ``nearest``: without a database, the tuned record of the nearest shape (sum of |log2| ratios of the
   sizes), its K splits raised where the new shape would launch under half the blocks it was tuned with;
4. ``device default``: the device's shipped fallback record;
5. ``built-in default``: the space's safe default, feasible for the dtype and device.

Every step chooses only what the float32 matmul precision setting allows (`autotile.dispatch.precision`): under
"highest", no tf32x3 config, whichever step would have offered it (cuBLAS, which CuPy runs without TF32,
is allowed under every setting). A problem may have one record per precision class (`cache.py`'s slots);
the exact and device-default steps take the fastest allowed.

A record counts only while it is current: its config still renders the kernel source that was timed
(`source_sha`), so a template change retires exactly the records it alters. Records tuned with the
library's compiler and options are preferred; where the whole chain of records finds none, records from
another compiler or other compile options are the fallback (the config is the same; its speed may differ,
and so may its arithmetic where the options do: `LEGACY_COMPILE_OPTIONS` flushed denormals to zero).
`cache.py` only stores and lists records: every decision is made here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Config, Problem
from autotile.dispatch import precision as precision_mod
from autotile.dispatch.cache import TuningCache
from autotile.dispatch.record import Record
from autotile.errors import ArgumentError, AutotileError, UnknownNameError
from autotile.runtime.impl import Cublas, Generated, Implementation

if TYPE_CHECKING:  # the model's modules are imported when the model step first runs
    from autotile.dispatch.database import ShapeDatabase
    from autotile.dispatch.model import Choice

# K per split (elements) below which raising a served config's splits only adds atomics (the floor for
# timing any split is `model.MIN_K_PER_SPLIT`)
MIN_K_PER_RAISED_SPLIT = 128
# Records made before they kept their compile options were compiled through CuPy's RawModule, whose options
# were exactly these (tests/test_build.py compares the cubins of the two paths). Today's COMPILE_OPTIONS keep
# denormals (no -ftz=true), so such records are other options' records: a fallback.
LEGACY_COMPILE_OPTIONS = ("-std=c++17", "-ftz=true", "--device-as-default-execution-space")


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a call runs: a generated `config`, or cuBLAS (`implementation` "cublas", `config` None); the step
    that chose it (`source`, in words; `step`, the step's name: "exact", "model", "nearest", "device
    default", "built-in default", "first call"); for a record, the shape it was tuned on; `why`, the model's
    reasoning; `precision`, the float32 matmul precision setting it was chosen under; `predicted_ms`, what it
    is expected to take on this problem in milliseconds (a record's own time on its very shape, the model's
    prediction from the shape database's times), None where nothing predicts it (another shape's record, a
    choice borrowed from another problem, a default)."""

    config: Config | None
    source: str
    tuned_shape: tuple[int, ...] | None
    record: Record | None = None
    implementation: str = "generated"
    why: str = ""
    precision: str = precision_mod.DEFAULT
    step: str = ""
    predicted_ms: float | None = None

    @property
    def tuned_here(self) -> bool:
        """Whether a current record of this very problem on this GPU chose it (the exact step, not a record of
        another compiler or another problem's): nothing left to tune for it."""
        return self.source == "exact"

    def explain(self) -> str:
        """One line: what runs, and why (and the precision setting, where it is not the default)."""
        tuned = f", tuned on {'x'.join(map(str, self.tuned_shape))}" if self.tuned_shape else ""
        what = self.config.key() if self.config is not None else "cuBLAS"
        setting = f" [precision {self.precision}]" if self.precision != precision_mod.DEFAULT else ""
        return f"{self.source}{tuned}: {what}" + (f" ({self.why})" if self.why else "") + setting

    def implementation_object(self) -> Implementation:
        """The `impl` object that runs this selection."""
        if self.implementation == "cublas" or self.config is None:
            return Cublas()
        return Generated(self.config)


@dataclasses.dataclass(frozen=True)
class Context:
    """What every step of the chain reads."""

    key: ProblemKey
    device: DeviceLimits
    cache: TuningCache
    accept: Callable[[Record], bool]  # which records count (current, and maybe same compiler)
    precision: str = precision_mod.DEFAULT  # the setting: what may run
    serves: ProblemKey | None = None  # a lender's context: the problem its choice is for (None: `key` itself)
    siblings: bool = True  # the model step may read another GPU's database where the GPU has none (`find`)


Step = Callable[[Context], "Selection | None"]


# -- which records count --------------------------------------------------------------------------------

def record_config(record: Record) -> Config | None:
    """The record's config in today's space, or None where it no longer parses."""
    try:
        return kernels.get(record.kernel).space.config(record.config)
    except Exception:  # an unknown parameter or value: the record is from another version of the space
        return None


def is_current(record: Record) -> bool:
    """Whether the record's config still renders the kernel that was timed (its `source_sha`)."""
    config = record_config(record)
    if config is None:
        return False
    return record.environment.get("source_sha") == _source_sha(record.kernel, config, record.dtype, record.layout)


@functools.lru_cache(maxsize=1024)
def _source_sha(kernel: str, config: Config, dtype: str, layout: str) -> str:
    return kernels.source_hash(kernels.get(kernel).render(config, dtype, layout))


def record_options(record: Record) -> tuple[str, ...]:
    """The compile options the record's kernel was built with (`LEGACY_COMPILE_OPTIONS` where it names none)."""
    return tuple(record.environment.get("compile_options") or LEGACY_COMPILE_OPTIONS)


def same_compiler(record: Record) -> bool:
    """Whether the record was tuned with the library's compiler (major version) and compile options."""
    env = record.environment
    return (kernels.compiler_major(str(env.get("compiler", ""))) == kernels.compiler_major(build.compiler_version())
            and record_options(record) == tuple(build.COMPILE_OPTIONS))


def counts(record: Record) -> bool:
    """Whether the chain serves the record before any fallback: current, and tuned with the library's
    compiler and compile options. A tuning result is stored over a faster entry that does not count (the
    cache's `put(is_current=counts)`): kept, that entry would be served only as a fallback, and the new
    result, which the chain would serve first, would be lost."""
    return same_compiler(record) and is_current(record)


def tuned_with(record: Record) -> str:
    """How a fallback record was built, for `Selection.source`: its compiler, and "other compile options"
    where its options are not today's (the compiler may then be the library's own)."""
    compiler = str(record.environment.get("compiler") or "another compiler")
    if record_options(record) != tuple(build.COMPILE_OPTIONS):
        return f"{compiler} and other compile options"
    return compiler


def runs_here(record: Record, key: ProblemKey) -> tuple[str, Config | dict[str, Any] | None]:
    """What a record runs for `key`: cuBLAS on the very shape it names cuBLAS for, its config otherwise
    (a nearest shape, the device default)."""
    if record.implementation == "cublas" and tuple(record.shape) == key.shape:
        return "cublas", None
    return "generated", record.config


def allowed(ctx: Context, record: Record) -> bool:
    """Whether the setting allows what `record` runs for the context's problem."""
    implementation, config = runs_here(record, ctx.key)
    return precision_mod.allows(ctx.precision, precision_mod.needed(record.kernel, record.dtype, config,
                                                                    implementation))


def _best_slot(ctx: Context, slots: dict[str, Record], source: str) -> Selection | None:
    """Of one problem's records (one per precision class), the fastest that counts and is allowed."""
    for record in sorted(slots.values(), key=lambda r: (r.run_ms, precision_mod.CLASSES.index(r.precision))):
        if ctx.accept(record) and allowed(ctx, record):
            found = _from_record(record, source, ctx)
            if found is not None:
                return found
    return None


# -- the steps ------------------------------------------------------------------------------------------

def exact(ctx: Context) -> Selection | None:
    return _best_slot(ctx, ctx.cache.slots(ctx.device.fingerprint, ctx.key, kernels.compat_hash(ctx.key.kernel)),
                      "exact")


def _model_choice(ctx: Context) -> tuple[ShapeDatabase, Choice, bool] | None:
    """The model step's reading: the shape database that covers `ctx.key` (the GPU's, or a sibling's where
    `ctx.siblings`), the model's `Choice` on it, and whether cuBLAS can run the problem; None where no
    database covers it."""
    from autotile.dispatch import database
    from autotile.dispatch.model import model_for, params_of

    db = (database.find if ctx.siblings else database.load)(ctx.cache, ctx.device.fingerprint, *_key_parts(ctx.key))
    if db is None or not db.shapes or not db.covers(ctx.key.shape):
        return None
    # where the vendor's call cannot run the problem (int8 shapes cuBLAS refuses; an 8-bit float problem
    # torch._scaled_mm refuses), the candidates are weighed against a generated reference, which runs where
    # none is predicted safely faster (against cuBLAS's column they would be unknown where it was not timed)
    cublas_runs = not _cublas_cannot(ctx.key) and not (ctx.serves is not None and _cublas_cannot(ctx.serves))
    choice = model_for(db, ctx.device, cublas_runs).choose(ctx.key.shape, params_of(db), setting=ctx.precision)
    return None if choice is None else (db, choice, cublas_runs)


def model(ctx: Context) -> Selection | None:
    found = _model_choice(ctx)
    if found is None:
        return None
    db, choice, cublas_runs = found
    if choice.config is None and not cublas_runs:
        return None
    whose = "" if db.device == ctx.device.fingerprint else f" on {db.environment.get('gpu', db.device)}"
    return Selection(choice.config, f"model ({len(db.shapes)} surveyed shapes{whose})", None, None,
                     choice.candidate.implementation, choice.explain(), ctx.precision, "model", choice.predicted_ms)


def runner_up(key: ProblemKey, device: DeviceLimits, cache: TuningCache | None = None,
              precision: str | None = None) -> tuple[Config, float] | None:
    """Where the model step weighs `key`'s candidates against cuBLAS and keeps cuBLAS: the best generated
    candidate it weighed and its predicted speed-up over cuBLAS (below the margin the model asks for), for
    a caller whose work the shape database's timings do not describe (the emulation's products, run a
    dozen at a time back to back). None where no database covers `key`, cuBLAS cannot run it, the model
    runs a generated candidate, or none was eligible."""
    ctx = Context(key, device, cache if cache is not None else TuningCache(), counts, precision_mod.resolve(precision))
    found = _model_choice(ctx)
    if found is None or not found[2]:
        return None
    choice = found[1]
    if choice.runner_up is None:
        return None
    return choice.runner_up.config, choice.runner_up.predicted


def nearest(ctx: Context) -> Selection | None:
    best: tuple[tuple[float, int, float, str], Record] | None = None
    for rank, path, record in ctx.cache.records(ctx.device.fingerprint, ctx.key, kernels.compat_hash(ctx.key.kernel)):
        if len(record.shape) != len(ctx.key.shape) or not ctx.accept(record) or not allowed(ctx, record):
            continue
        # Nearest shape first; ties go to the user's own entries, then to the faster one.
        order = (log_distance(record.shape, ctx.key.shape), rank, record.time_ms, str(path))
        if best is None or order < best[0]:
            best = (order, record)
    return _from_record(best[1], "nearest", ctx) if best is not None else None


def device_default(ctx: Context) -> Selection | None:
    slots = ctx.cache.default_slots(ctx.device.fingerprint, ctx.key, kernels.compat_hash(ctx.key.kernel))
    return _best_slot(ctx, slots, "device default")


def builtin_default(ctx: Context) -> Selection:
    """The space's default for the layout, in the part of the space the setting allows (under "highest", a
    SIMT config): the first default that is feasible, else the first feasible named config, else cuBLAS."""
    space = precision_mod.restricted(kernels.get(ctx.key.kernel).space, ctx.key.dtype, ctx.precision)
    problem = Problem(ctx.device, ctx.key.dtype, ctx.key.layout)
    try:
        config = space.default_config(ctx.key.layout, problem)
    except UnknownNameError:  # every default of the layout was narrowed away
        named = [c for n, c in space.named_configs.items()
                 if space.named_layouts.get(n, ctx.key.layout) == ctx.key.layout]
        fallback = next((c for c in named if space.is_feasible(c, problem)), named[0] if named else None)
        if fallback is None:
            raise
        config = fallback
    if not space.is_feasible(config, problem):  # the space's default is not for this dtype (16-bit, int8)
        from autotile.runtime.cublas import unsupported_reason

        cannot = unsupported_reason(ctx.key)
        runnable: Config | None = next((c for c in space.named_configs.values() if space.is_feasible(c, problem)), None)
        if cannot is not None:  # cuBLAS cannot run it (int8 outside layout nt, or with odd leading dimensions)
            if runnable is None:
                raise ArgumentError(f"{ctx.key.dtype} {ctx.key.kernel} {'x'.join(map(str, ctx.key.shape))} "
                                    f"({ctx.key.layout}) on {ctx.device.name}: no generated kernel runs "
                                    f"{ctx.key.dtype} there, and {cannot}")
            return Selection(runnable, "built-in default", None, precision=ctx.precision, step="built-in default")
        reason = f"no tuned {ctx.key.kernel} record for {ctx.key.dtype}" if runnable is not None else \
            f"no generated {ctx.key.kernel} kernel runs {ctx.key.dtype} on {ctx.device.name}"
        return Selection(None, "built-in default", None, None, "cublas", reason, ctx.precision, "built-in default")
    return Selection(config, "built-in default", None, precision=ctx.precision, step="built-in default")


RECORD_STEPS: tuple[Step, ...] = (exact, model, nearest, device_default)


def _from_record(record: Record, source: str, ctx: Context) -> Selection | None:
    config = record_config(record)
    if config is None:
        return None
    space = kernels.get(ctx.key.kernel).space
    if not space.is_feasible(config, Problem(ctx.device, ctx.key.dtype, ctx.key.layout)):
        return None  # tuned elsewhere (another dtype's limits, a profile's): not runnable here
    tuned_shape = tuple(record.shape)
    step = source
    if record.implementation == "cublas" and tuned_shape == ctx.key.shape:
        return Selection(None, source, tuned_shape, record, "cublas",
                         f"cuBLAS {record.baseline_ms:g} ms beat the best config's {record.time_ms:g} ms",
                         ctx.precision, step, record.run_ms)
    predicted_ms = None
    if tuned_shape != ctx.key.shape:
        refilled = keep_grid_filled(ctx.key, config, tuned_shape)
        if refilled != config:
            source += f", SPLIT_K raised {config['SPLIT_K']}->{refilled['SPLIT_K']}"
            config = refilled
    else:
        predicted_ms = record.time_ms
    return Selection(config, source, tuned_shape, record, precision=ctx.precision, step=step,
                     predicted_ms=predicted_ms)


def select(key: ProblemKey, device: DeviceLimits, cache: TuningCache | None = None,
           precision: str | None = None) -> Selection:
    """What the library runs for `key` on `device` under the float32 matmul `precision` setting (None: the
    process-wide one): the first step of the chain that answers. A problem without records of its own
    borrows those of the problems `borrowed_keys` names (after its own exact and model steps, before its
    own nearest shapes). Records of another compiler (or other compile options) come only after the whole
    chain has found none of its own."""
    setting = precision_mod.resolve(precision)
    cache = cache if cache is not None else TuningCache()
    strict = Context(key, device, cache, counts, setting)
    lenders = [dataclasses.replace(strict, key=k, serves=key) for k in borrowed_keys(key)]
    for steps in ((exact, model), (nearest, device_default)):
        for ctx in (*_own_gpu_first(strict, lenders), strict, *lenders):
            for step in steps:
                found = step(ctx)
                if found is not None and ctx.serves is not None:
                    found = borrowed(found, ctx.key, key, device)
                if found is not None:
                    return found
    loose = dataclasses.replace(strict, accept=is_current)
    for ctx in (loose, *(dataclasses.replace(c, accept=is_current) for c in lenders)):
        for step in (exact, nearest, device_default):
            found = step(ctx)
            if found is not None and ctx.key != key:
                found = borrowed(found, ctx.key, key, device)
            if found is not None:
                how = tuned_with(found.record) if found.record else "?"
                return dataclasses.replace(found, source=f"{found.source}, tuned with {how}")
    return builtin_default(strict)


def _own_gpu_first(strict: Context, lenders: list[Context]) -> list[Context]:
    """The contexts asked before the chain's own order (the problem, then its lenders, each through `find`:
    the GPU's database, else a sibling GPU's): the problem and its lenders of the same kernel (another layout,
    float16's bfloat16) on the GPU's own databases only, as `database.find_first` orders them (why: there).
    A lender of another kernel (a batch borrowing one matrix's choice, 0.91x cuBLAS on the 16-bit batches)
    stays after the sibling's database of the problem's own kernel."""
    same_kernel = [c for c in lenders if c.key.kernel == strict.key.kernel]
    if not same_kernel:
        return []
    return [dataclasses.replace(c, siblings=False) for c in (strict, *same_kernel)]


# -- borrowing another problem's choice -----------------------------------------------------------------

def lending_layouts(dtype: str, layout: str) -> list[str]:
    """The matmul layouts whose choices serve `layout`'s where it has none, nearest first. Every layout
    borrows nn's (the same tiles and arithmetic; only the copies into shared memory differ), except for the
    8-bit types, whose kernels differ by layout (wgmma reads 8-bit operands K-major only: nt's tiles go
    straight to the tensor cores, nn's and tt's producer transposes one operand, tn's both): tt and tn
    borrow nn's (a transposed operand too), then nt's; nn borrows nt's."""
    if dtypes.get(dtype).k_major_only:
        return {"nt": [], "nn": ["nt"], "tt": ["nn", "nt"], "tn": ["nn", "nt"]}[layout]
    main = dtypes.main_layout(dtype)
    return [] if layout == main else [main]


def borrowed_keys(key: ProblemKey) -> list[ProblemKey]:
    """The problems whose choice serves `key` where it has no record of its own, nearest first: other
    layouts' (`lending_layouts`), a batch's in another layout before one matrix's (how the batch fills
    the GPU decides more than the copies do), then one matrix's (the same kernel, one more grid
    dimension); a matvec borrows no other layout's (row- and column-major kernels differ). float16 borrows
    bfloat16's choices after its own, the 8-bit floats int8's (the same kernels, at the same speed)."""
    found: list[ProblemKey] = []
    layouts = [] if key.kernel == "matvec" else lending_layouts(key.dtype, key.layout)
    if key.kernel == "bmm":
        found += [dataclasses.replace(key, layout=layout) for layout in layouts]
        single = ProblemKey("matmul", key.dtype, key.layout, key.shape[1:])
        found.append(single)
        found += [dataclasses.replace(single, layout=layout) for layout in layouts]
    else:
        found += [dataclasses.replace(key, layout=layout) for layout in layouts]
    if key.dtype == "float16":  # the same kernels as bfloat16's, at the same tensor-core rate: its choices
        found += [dataclasses.replace(k, dtype="bfloat16") for k in (key, *found)]
    if dtypes.get(key.dtype).scaled:  # the 8-bit floats: int8's kernels and tensor-core rate, its choices
        found += [dataclasses.replace(k, dtype="int8") for k in (key, *found)]
    return found


def database_families(key: ProblemKey) -> list[tuple[str, str, str]]:
    """(kernel, dtype, layout) of the problem and of the problems of its kernel it borrows from, nearest
    first: the shape databases that may serve it, in the order `database.find_first` reads them."""
    return [_key_parts(k) for k in (key, *borrowed_keys(key)) if k.kernel == key.kernel]


def borrowed(found: Selection, lender: ProblemKey, key: ProblemKey, device: DeviceLimits) -> Selection | None:
    """`found`, chosen for `lender`, as the choice for `key`; None where its config cannot run `key` (a
    config the other layout's limits refuse). cuBLAS stays cuBLAS (it takes every layout and batches), except
    where it cannot run `key` (`autotile.runtime.cublas.unsupported_reason`: int8 outside nt). For a
    batch, the K splits are lowered where the batch fills the GPU by itself: the fewest splits that launch
    as many blocks as the config did on one matrix."""
    dtype = f" {lender.dtype}" if lender.dtype != key.dtype else ""
    source = f"{found.source} of {lender.kernel}{dtype} {lender.layout} {lender.shape_text}"
    if found.config is None:
        return None if _cublas_cannot(key) else dataclasses.replace(found, source=source, predicted_ms=None)
    config = found.config
    if dtypes.get(key.dtype).k_major_only and {lender.layout, key.layout} == {"nn", "tt"}:
        # tt is nn with the operands' roles swapped (A transposed in the producer instead of B): the tile
        # mirrored keeps the TMA's operand on its long side (8192^3 on an H100: 477 TOP/s with 128 x 256
        # in tt against 268 with nn's 256 x 128)
        try:
            config = kernels.get(key.kernel).space.with_overrides(config, {"BM": config["BN"], "BN": config["BM"]})
        except AutotileError:  # a tile the space has no mirror of: not a choice for tt
            return None
    if key.kernel == "bmm" and lender.kernel == "matmul":
        config = fewer_splits_for_batch(config, lender.shape, key.shape[0])
    space = kernels.get(key.kernel).space
    if not space.is_feasible(config, Problem(device, key.dtype, key.layout)):
        return None
    return dataclasses.replace(found, config=config, source=source, predicted_ms=None)


def _cublas_cannot(key: ProblemKey) -> bool:
    """Whether the vendor's call cannot compute `key`: cuBLAS for int8 outside layout nt, or with leading
    dimensions that are not multiples of 4; for the 8-bit floats, whose vendor call is torch._scaled_mm
    (cuBLASLt: `SCALED_MM_MULTIPLE`), a problem it refuses. An 8-bit float problem borrows int8's database,
    whose cuBLAS column stands for torch._scaled_mm's speed (cuBLAS's int8 GEMM and cuBLASLt's 8-bit float
    GEMM run at the same tensor-core rate)."""
    if dtypes.get(key.dtype).scaled:
        return not scaled_mm_takes(key)
    from autotile.runtime.cublas import unsupported_reason

    return unsupported_reason(key) is not None


# torch._scaled_mm (per-tensor scales) takes A row-major and B column-major (layout nt), K and N multiples of
# 16, and not two float8_e5m2 operands (torch 2.11)
SCALED_MM_MULTIPLE = 16


def scaled_mm_takes(key: ProblemKey) -> bool:
    """Whether torch._scaled_mm computes the 8-bit float problem `key` (both operands of `key.dtype`)."""
    if key.kernel != "matmul" or key.layout != "nt" or key.dtype != "float8_e4m3fn":
        return False
    _, N, K = key.shape
    return N % SCALED_MM_MULTIPLE == 0 and K % SCALED_MM_MULTIPLE == 0


def fewer_splits_for_batch(config: Config, shape: tuple[int, ...], batch: int) -> Config:
    """A one-matrix config for a batch of `batch` such matrices: SPLIT_K lowered to the smallest choice whose
    launch over the batch has at least the blocks the config launched on one matrix (`shape`, MxNxK)."""
    if config.get("SPLIT_K", 1) <= 1:
        return config
    spec = kernels.get("matmul")
    target = math.prod(spec.grid(config, shape))
    for split in sorted(spec.space.params["SPLIT_K"].choices):
        if split >= config["SPLIT_K"]:
            break
        candidate = spec.space.with_overrides(config, {"SPLIT_K": split})
        if batch * math.prod(spec.grid(candidate, shape)) >= target:
            return candidate
    return config


# -- helpers --------------------------------------------------------------------------------------------

def _key_parts(key: ProblemKey) -> tuple[str, str, str]:
    return key.kernel, key.dtype, key.layout


def log_distance(a: Sequence[int], b: Sequence[int]) -> float:
    """How far apart two shapes are: the sum over dimensions of |log2(a/b)|."""
    return sum(abs(math.log2(x / y)) for x, y in zip(a, b, strict=True))


def keep_grid_filled(key: ProblemKey, config: Config, tuned_shape: tuple[int, ...]) -> Config:
    """A nearest-shape config, its K splits raised where the new shape would launch under half the blocks
    it was tuned with (fewer rows, say): the smallest SPLIT_K that restores the tuned block count, with
    at least MIN_K_PER_RAISED_SPLIT of K each. Only ever raises SPLIT_K, so a shape that fills the GPU keeps the
    tuned config. (Measured cause: on an H200, column-major matvec 20000x3000 ran at 0.69x the speed of a
    config tuned for it when served 65536x4096's config, whose only difference was SPLIT_K 1 against 8.)

    SPLIT_REDUCE stays as tuned: a last_block config keeps summing in its last block, and one raised from
    SPLIT_K 1 keeps the inactive value, atomic, which is how every raise was measured before last_block
    existed. (last_block would spare the zeroing launch, but it is untimed on those shapes, and it needs
    a workspace of SPLIT_K x the output; a tuned record says which one wins.)"""
    spec = kernels.get(key.kernel)
    if "SPLIT_K" not in config:
        return config

    def blocks(c: Config, shape: tuple[int, ...]) -> int:
        return math.prod(spec.grid(c, shape))

    target = blocks(config, tuned_shape)
    if 2 * blocks(config, key.shape) >= target:
        return config
    best = config
    for split in sorted(v for v in spec.space.params["SPLIT_K"].choices if v > config["SPLIT_K"]):
        if key.shape[-1] < split * MIN_K_PER_RAISED_SPLIT:
            break
        best = spec.space.with_overrides(config, {"SPLIT_K": split})
        if blocks(best, key.shape) >= target:
            break
    return best


def explain(key: ProblemKey, device: DeviceLimits, cache: Any = None, precision: str | None = None) -> str:
    """Which config `key` gets on `device`, and why, in one line (for people and tests)."""
    return select(key, device, cache, precision).explain()


__all__ = ["MIN_K_PER_RAISED_SPLIT", "RECORD_STEPS", "SCALED_MM_MULTIPLE", "Selection", "allowed", "borrowed",
           "borrowed_keys", "builtin_default", "lending_layouts", "counts", "device_default", "fewer_splits_for_batch",
           "exact", "explain", "is_current", "keep_grid_filled", "log_distance", "model", "nearest", "record_options",
           "runs_here", "same_compiler", "scaled_mm_takes", "select", "tuned_with"]
