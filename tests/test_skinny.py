"""MATH=skinny, the short-M matmul kernels (templates/matmul_skinny.cu.j2).

Without a GPU: the space (tiles under 16 only for skinny, the precision class, the named configs feasible in
every layout, the 16-bit types' K splits summed in float32 only), and the named configs and a random sample of
the skinny sub-space compiled by the library's NVRTC for sm_90 and sm_80, in all four layouts and batched,
float32, float64, bfloat16 and float16: no spills, registers within the launch bound, shared memory as the
space says.
On a GPU (marker gpu): every named config and a random sample against a float64 reference on shapes no tile
divides (M of 1 to 64, odd N and K), the output poisoned first, all layouts, batched with a broadcast
operand, split-K summed both ways; special values give IEEE's Inf/NaN pattern (the FMAs are FP32's own).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re

import numpy as np
import pytest
from sass_support import needs_sass
from sass_support import sass as sass_of

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Config, Problem
from autotile.dispatch import precision

MATMUL, BMM = kernels.get("matmul"), kernels.get("bmm")
SPACE = MATMUL.space
NAMES = [n for n, c in SPACE.named_configs.items() if c["MATH"] == "skinny"]
LAYOUTS = ("nn", "nt", "tn", "tt")


def _sample(dtype: str, layout: str, n: int, seed: int) -> list[Config]:
    """`n` feasible skinny configs drawn at random, knob by knob, from a named one (the space's own sampler
    draws from the whole matmul space, of which skinny is a small share)."""
    rng = np.random.default_rng(seed)
    problem = Problem(PROFILES["h100"], dtype, layout)
    knobs = ("smem", "BM", "BN", "TN", "THREADS_K", "STEPS", "VEC", "SPLIT_K", "SPLIT_REDUCE")
    found: list[Config] = []
    while len(found) < n:
        drawn = {k: SPACE.params[k].choices[rng.integers(len(SPACE.params[k].choices))] for k in knobs}
        if drawn["SPLIT_K"] == 1:
            drawn["SPLIT_REDUCE"] = "atomic"
        config = SPACE.with_overrides(SPACE.named("skinny-t-16"), drawn)
        if SPACE.is_feasible(config, problem) and config not in found:
            found.append(config)
    return found


def test_small_tiles_are_skinny_only_and_skinny_is_ieee():
    problem = Problem(PROFILES["h100"], "float32", "nn")
    simt = SPACE.named("safe-default")
    for overrides in ({"BM": 8}, {"BN": 4}):
        assert not SPACE.is_feasible(SPACE.with_overrides(simt, overrides), problem)
    assert precision.needed("matmul", "float32", SPACE.named("skinny-t-16")) == "highest"
    # every named skinny config runs in every layout (each declares the shared memory B row-major needs)
    for name in NAMES:
        for layout in LAYOUTS:
            assert SPACE.is_feasible(SPACE.named(name), Problem(PROFILES["h100"], "float32", layout)), (name, layout)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_16_bit_types_are_widened_and_summed_in_float32(dtype):
    # every named config runs them in every layout; a K split meets in float32 (last_block), never by atomics
    # on the 16-bit C, which would round each split's sum
    for name in NAMES:
        for layout in LAYOUTS:
            assert SPACE.is_feasible(SPACE.named(name), Problem(PROFILES["h100"], dtype, layout)), (name, layout)
    problem = Problem(PROFILES["h100"], dtype, "nt")
    atomic = SPACE.with_overrides(SPACE.named("skinny-t-16"), {"SPLIT_K": 4, "SPLIT_REDUCE": "atomic"})
    assert not SPACE.is_feasible(atomic, problem)
    assert SPACE.is_feasible(SPACE.with_overrides(atomic, {"SPLIT_REDUCE": "last_block"}), problem)
    for name in ("skinny-t-16", "skinny-n-16-split4"):
        for layout in ("nt", "nn"):
            source = MATMUL.render(SPACE.named(name), dtype, layout)
            assert "float acc[" in source and "widen(" in source and "narrow(" in source, (name, layout)
    float32 = MATMUL.render(SPACE.named("skinny-n-16-split4"), "float32", "nn")
    assert "T acc[" in float32 and "widen(" not in float32  # float32 sums in its own type, as before


@dataclasses.dataclass(frozen=True)
class Case:
    arch: str
    layout: str
    dtype: str
    label: str
    config: Config
    batched: bool = False

    @property
    def id(self) -> str:
        return f"{self.arch}-{self.layout}-{self.dtype}-{self.label}{'-batched' if self.batched else ''}"


def _cases() -> list[Case]:
    out = []
    for i, name in enumerate(NAMES):  # each in one layout of B stored transposed and one of B row-major
        for layout in (LAYOUTS[1 + 2 * (i % 2)], LAYOUTS[2 * (i % 2)]):
            out.append(Case("sm_90", layout, "float32", name, SPACE.named(name), batched=layout[0] == "t"))
    for k, layout in enumerate(LAYOUTS):
        for dtype in ("float32", "float64"):
            for i, config in enumerate(_sample(dtype, layout, 2, seed=17 + k)):
                out.append(Case("sm_80" if i % 2 else "sm_90", layout, dtype, f"random{i}", config, batched=k == i))
    for k, layout in enumerate(LAYOUTS):  # the 16-bit types: a named config and a random one per layout
        for j, dtype in enumerate(("bfloat16", "float16")):
            name = NAMES[(2 * k + j) % len(NAMES)]
            out.append(Case("sm_90", layout, dtype, name, SPACE.named(name), batched=j == 1))
            out.append(Case("sm_80", layout, dtype, "random0", _sample(dtype, layout, 1, seed=31 + k)[0]))
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def compiled() -> dict[str, build.CompileResult | BaseException]:
    def one(case: Case) -> build.CompileResult:
        spec = BMM if case.batched else MATMUL
        return build.compile(spec.render(case.config, case.dtype, case.layout), case.arch)

    out: dict[str, build.CompileResult | BaseException] = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {pool.submit(one, case): case for case in CASES}
        for future in concurrent.futures.as_completed(futures):
            try:
                out[futures[future].id] = future.result()
            except BaseException as exc:  # reported by the test of that case
                out[futures[future].id] = exc
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_compiles_without_spills(compiled, case):
    result = compiled[case.id]
    if isinstance(result, BaseException):
        raise result
    usage = result.usages[0]
    geometry = MATMUL.geometry(case.config, case.dtype, case.layout)
    assert 0 < usage.registers <= min(255, 65536 // geometry["threads"]), usage
    assert usage.spill_stores == 0 and usage.spill_loads == 0, (case.config.key(), usage)
    assert usage.static_smem == (geometry["smem_bytes"] if case.config["smem"] == "static" else 0)


def _sass_blocks(source: str) -> list[list[str]]:
    """The basic blocks of `source`'s sm_90 SASS (`sass_support.sass`): lists of
    instruction lines, split at labels and at branches, reconvergence and exits."""
    blocks: list[list[str]] = [[]]
    for line in sass_of(source, "sm_90").splitlines():
        if line.rstrip().endswith(":") or re.search(r"\b(BRA|BSYNC|EXIT|RET)\b", line):
            blocks.append([])
        elif "/*" in line:
            blocks[-1].append(line)
    return [b for b in blocks if b]


def _reads(line: str, register: int) -> bool:
    """Whether an instruction line reads `register` (a source operand: after the first comma)."""
    return re.search(rf"\bR{register}\b", line.split(";")[0].split(",", 1)[-1]) is not None


def _destination(line: str) -> int:
    match = re.search(r"LDG\S*\s+R(\d+),", line)
    assert match, line
    return int(match.group(1))


@needs_sass
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,layout,vec", [("skinny-t-4", "nt", 4), ("skinny-t-1", "nt", 4), ("skinny-n-4", "nn", 4),
                                             ("skinny-t-1", "nt", 8), ("skinny-n-4", "nn", 8)])
def test_16_bit_loads_are_issued_back_to_back(name, layout, vec, dtype):
    # Unpacking (or packing) 16-bit elements next to their load, inside a guard, made each thread wait for
    # every load in turn (one in flight per thread: 0.4-1.1 TB/s on an H100). Vector loads (8 bytes for VEC 4,
    # 16 for VEC 8): nothing in a vector load's block reads what it loaded. Single elements (rows not aligned
    # to a vector): a block issues a whole step's loads before any of them is read.
    config = SPACE.with_overrides(SPACE.named(name), {"VEC": vec})
    assert SPACE.is_feasible(config, Problem(PROFILES["h100"], dtype, layout))
    blocks = _sass_blocks(MATMUL.render(config, dtype, layout))
    words = vec // 2  # 32-bit registers a vector load fills
    vector_loads = 0
    for block in blocks:
        for at, line in enumerate(block):
            if f"LDG.E.{16 * vec}" in line:
                vector_loads += 1
                low = _destination(line)
                readers = [later for later in block[at + 1:] if any(_reads(later, low + w) for w in range(words))]
                assert not readers, (line, readers)
    assert vector_loads >= config["STEPS"]
    single = config["STEPS"] * config["TN"] * config["VEC"]  # B's elements of one step, A's aside
    widest = 0
    for block in blocks:
        loads = [at for at, line in enumerate(block) if "LDG.E.U16" in line]
        if not loads:
            continue
        read_early = [block[at] for at in loads
                      if any(_reads(line, _destination(block[at])) for line in block[at + 1:loads[-1]])]
        if not read_early:
            widest = max(widest, len(loads))
    assert widest >= single, f"no block issues a step's {single} single loads before reading them"


def _most_in_flight(block: list[str], width: str, registers: int) -> int:
    """The most loads of `width` (`LDG.E.64`, ...) that a basic block has issued and not yet read at any point
    (a load fills `registers` registers from its destination on; reading any of them waits for it)."""
    pending: dict[int, range] = {}
    most = 0
    for at, line in enumerate(block):
        for load in [load for load, regs in pending.items() if any(_reads(line, r) for r in regs)]:
            del pending[load]
        if width in line:
            first = _destination(line)
            pending[at] = range(first, first + registers)
            most = max(most, len(pending))
    return most


@needs_sass
@pytest.mark.parametrize("name,layout", [("skinny-t-4", "nt"), ("skinny-t-16", "nt"), ("skinny-t-1", "nt"),
                                         ("skinny-n-4", "nn")])
def test_realigned_pieces_are_in_flight_together(name, layout):
    # REALIGN's pieces shifted next to their loads made each thread wait for every vector in turn (H100,
    # 2026-12-07: 2-4x slower than single elements; two pieces in flight). Shifted once the step's loads are
    # issued, a thread keeps at least a step's pieces of B (two a vector) in flight. (VEC 8: ptxas keeps
    # fewer, 2-12; not asserted.)
    config = SPACE.with_overrides(SPACE.named(name), {"VEC": 4, "REALIGN": True})
    assert SPACE.is_feasible(config, Problem(PROFILES["h100"], "bfloat16", layout))
    blocks = _sass_blocks(MATMUL.render(config, "bfloat16", layout))
    most = max(_most_in_flight(block, "LDG.E.64", 2) for block in blocks)  # a piece: 4 elements, 8 bytes
    assert most >= 2 * config["TN"], most


# -- on a GPU ----------------------------------------------------------------------------------------------

# Odd shapes (every load a single element's: no N or K a multiple of 4), then shapes whose rows allow vector loads
# of up to 8 elements (N and K odd multiples of 8, of no tile's size but 8): both paths of every kernel.
SHAPES = [(1, 1, 1), (1, 257, 1031), (5, 131, 67), (16, 97, 2053), (33, 61, 129), (64, 67, 7), (3, 4099, 37),
          (1, 264, 1032), (5, 136, 520), (33, 72, 2056)]


def _stored(x: np.ndarray, transposed: bool) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)) if transposed else x


def _run(config: Config, a: np.ndarray, b: np.ndarray, layout: str, dtype: str) -> np.ndarray:
    """C = A B through the generated kernel (A M x K, B K x N, or batches; a 2-D operand is broadcast)."""
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Generated

    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = a.shape[0] if a.ndim == 3 else b.shape[0] if b.ndim == 3 else None
    shape = (M, N, K) if batch is None else (batch, M, N, K)
    out = cupy.full(((batch,) if batch else ()) + (M, N), cupy.nan, dtype=dtype)  # poisoned
    key = ProblemKey("matmul" if batch is None else "bmm", dtype, layout, shape)
    store_a, store_b = cupy.asarray(_stored(a, layout[0] == "t")), cupy.asarray(_stored(b, layout[1] == "t"))
    runner = Generated(config).prepare(key)
    runner.run((store_a, store_b), out)
    runner.run((store_a, store_b), out)  # twice: split-K's tickets and zeroing hold up on a second launch
    return cupy.asnumpy(out)


def _check(c: np.ndarray, a: np.ndarray, b: np.ndarray, dtype: str, what: tuple = ()) -> None:
    """C against the float64 product of A and B, within `dtype`'s tolerance; `what` names the case on failure."""
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert np.all(np.isfinite(c)), "unwritten (NaN-poisoned) or non-finite outputs"
    err = np.max(np.abs(c - ref) / np.maximum(scale, np.finfo(np.float64).tiny))
    assert err <= kernels.tolerance(dtype, a.shape[-1]), (*what, err, kernels.tolerance(dtype, a.shape[-1]))


def _half_run_and_check(config: Config, M: int, N: int, K: int, layout: str, dtype: str, rng, batch: int = 0
                        ) -> None:
    """A 16-bit product through the kernel (operands rounded to `dtype`, held as its storage), against the
    float64 product of the rounded values: within the tolerance of float32 sums rounded once to `dtype`."""
    import cupy

    from autotile.codegen.dtypes import from_float32, to_float32
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Generated

    lead = (batch,) if batch else ()
    a32 = rng.standard_normal(lead + (M, K)).astype(np.float32)
    b32 = rng.standard_normal(lead + (K, N)).astype(np.float32)
    a, b = from_float32(cupy.asarray(a32), dtype), from_float32(cupy.asarray(b32), dtype)
    a64, b64 = (to_float32(x, dtype).get().astype(np.float64) for x in (a, b))
    stored = [cupy.ascontiguousarray(x.swapaxes(-1, -2)) if t == "t" else x
              for x, t in zip((a, b), layout, strict=True)]
    out = (cupy.full(lead + (M, N), 0x7FC0, dtype=cupy.uint16) if dtype == "bfloat16"
           else cupy.full(lead + (M, N), cupy.nan, dtype=cupy.float16))  # poisoned
    key = ProblemKey("bmm" if batch else "matmul", dtype, layout, lead + (M, N, K))
    runner = Generated(config).prepare(key)
    for _ in range(2):  # split-K's tickets hold up on a second launch
        runner.run(tuple(stored), out)
    _check(to_float32(out, dtype).get().astype(np.float64), a64, b64, dtype, (config.key(), layout, (M, N, K)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", NAMES)
def test_16_bit_matches_float64_on_odd_shapes_in_every_layout(name, dtype):
    rng = np.random.default_rng(8)
    configs = [SPACE.named(name), SPACE.with_overrides(SPACE.named(name), {"SPLIT_K": 8, "SPLIT_REDUCE": "last_block"}),
               SPACE.with_overrides(SPACE.named(name), {"VEC": 2}),  # words of one pair each
               SPACE.with_overrides(SPACE.named(name), {"VEC": 8})]  # 16-byte loads, where the tile allows them
    for config in configs:
        for layout in LAYOUTS:
            if not SPACE.is_feasible(config, Problem(PROFILES["h100"], dtype, layout)):
                continue
            for M, N, K in SHAPES:
                _half_run_and_check(config, M, N, K, layout, dtype, rng)
    _half_run_and_check(configs[0], 7, 131, 257, "nt", dtype, rng, batch=3)


def _gpu_configs() -> list[tuple[str, str, Config]]:
    out = [(name, "float32", SPACE.named(name)) for name in NAMES]
    out += [(f"random{i}-{dtype}", dtype, c) for dtype in ("float32", "float64")
            for i, c in enumerate(_sample(dtype, "nt", 6, seed=99))]
    for name in ("skinny-t-16", "skinny-n-16"):  # both sums of K splits, both layouts of B
        for reduce in ("atomic", "last_block"):
            out.append((f"{name}-split3-{reduce}", "float32",
                        SPACE.with_overrides(SPACE.named(name), {"SPLIT_K": 8, "SPLIT_REDUCE": reduce})))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("label,dtype,config", _gpu_configs(), ids=[c[0] for c in _gpu_configs()])
def test_matches_float64_on_odd_shapes_in_every_layout(label, dtype, config):
    rng = np.random.default_rng(5)
    for layout in LAYOUTS:
        if not SPACE.is_feasible(config, Problem(PROFILES["h100"], dtype, layout)):
            continue
        for M, N, K in SHAPES:
            a = rng.standard_normal((M, K)).astype(dtype)
            b = rng.standard_normal((K, N)).astype(dtype)
            _check(_run(config, a, b, layout, dtype), a, b, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["skinny-t-8", "skinny-n-16-split4"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batched_with_a_broadcast_weight(name, layout):
    rng = np.random.default_rng(6)
    for M, N, K in [(7, 131, 257), (1, 33, 1031)]:
        a = rng.standard_normal((3, M, K)).astype(np.float32)
        w = rng.standard_normal((K, N)).astype(np.float32)  # one weight for the batch
        _check(_run(SPACE.named(name), a, w, layout, "float32"), a, np.broadcast_to(w, (3, K, N)), "float32")
        b = rng.standard_normal((3, K, N)).astype(np.float32)
        _check(_run(SPACE.named(name), a, b, layout, "float32"), a, b, "float32")


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_special_values_follow_ieee(name):
    # Inf and NaN in A and B, padded rows and columns next to them: the non-finite pattern of a float64
    # product of the same values (plain FMAs, no splitting, so IEEE's own).
    rng = np.random.default_rng(7)
    M, N, K = 13, 67, 131
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    a[3, 7], a[12, 0], b[5, 60], b[130, 66] = np.inf, np.nan, -np.inf, np.inf
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for layout in LAYOUTS:
        c = _run(SPACE.named(name), a, b, layout, "float32")
        for f in (np.isnan, np.isposinf, np.isneginf):
            assert np.array_equal(f(c), f(ref)), (layout, f.__name__)
