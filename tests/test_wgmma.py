"""MATH=wgmma (3xTF32 on Hopper's wgmma, templates/matmul_wgmma.cu.j2) without a GPU: the space keeps it to
sm_90 and out of searches until verified, its shared-memory stores are free of bank conflicts, every named
config compiles for sm_90a within a register bound, in nn and, with the others, so that every parameter
value is compiled in every layout, batched and not (a covering set: CASES), and the SASS
multiplies with HGMMA and splits only in the producer. GPU correctness: tests/test_wgmma_gpu.py."""

from __future__ import annotations

import random

import pytest
from covering import config_coverage, covering
from sass_support import needs_sass
from sass_support import sass as sass_of

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem
from autotile.errors import CompileError
from autotile.tuning import propose

SPEC = kernels.get("matmul")
WGMMA = SPEC.space.restricted({"MATH": "wgmma"})
NAMES = [n for n, c in SPEC.space.named_configs.items() if c["MATH"] == "wgmma"]
LAYOUTS = ("nn", "nt", "tn", "tt")
NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")
# Spilled bytes ptxas may report per named config (0 but where a config is known to spill; see the commit
# log: the producer's hoisted addresses and two 64 x 128 accumulator sets per consumer crowd 384 threads).
# Measured (CUDA 13 NVRTC) at this commit: the configs with two consumer warpgroups spill 150-710 bytes
# (producer and consumers share 384 threads' registers; setmaxnreg 216/144), wgmma-64 batched 8 bytes.
# The K loop itself stays free of local memory (test_sass_...). Lower these as the kernel improves.
SPILL_BOUND = {"wgmma-128": 768, "wgmma-128x64": 768, "wgmma-128-k64": 768, "wgmma-64": 16}


def test_named_configs_exist():
    assert {"wgmma-128", "wgmma-64", "wgmma-64-split8"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_space_keeps_wgmma_to_sm90_float32(name):
    config = SPEC.space.named(name)
    for profile in ("h100", "h200"):
        problem = Problem(PROFILES[profile], "float32", "nn")
        assert WGMMA.is_feasible(config, problem), WGMMA.violations(config, problem)
        assert SPEC.space.is_feasible(config, problem)  # the full space, which the tuner searches
    for profile in ("a100", *(p for p in PROFILES if PROFILES[p].compute_capability != (9, 0))):
        assert not WGMMA.is_feasible(config, Problem(PROFILES[profile], "float32", "nn"))
    assert not WGMMA.is_feasible(config, Problem(PROFILES["h100"], "float64", "nn"))


def test_a_fix_draws_wgmma_only():
    problem = Problem(PROFILES["h100"], "float32", "nn")
    # the tuner's own uniform draw over the space with MATH fixed (`--fix MATH=wgmma`): 780 feasible
    # configs among billions of raw draws, found by enumeration
    rng, taken = random.Random(1), set()
    for _ in range(10):
        config = propose.uniform(WGMMA, problem, rng, taken)
        assert config is not None and config["MATH"] == "wgmma"
        taken.add(config.key())


def _swizzled(row: int, k: int, rows: int, bk: int) -> int:
    """The template's `swizzled<R>(row, k)`: byte offset of (row, k) in a K-major tile of `rows` rows."""
    w = min(4 * bk, 128)
    logical = ((k * 4) // w) * (rows * w) + row * w + (k * 4) % w
    return logical ^ (((logical >> 7) & (w // 16 - 1)) << 4)


def _conflicts(addresses: list[int], width: int) -> int:
    """Extra wavefronts of one warp-wide shared store of `width` bytes per lane (0: conflict-free)."""
    phase = max(1, 32 * width // 128)  # lanes per 128-byte wavefront
    worst = 0
    for start in range(0, 32, 32 // phase if width > 4 else 32):
        lanes = addresses[start:start + (32 // phase if width > 4 else 32)]
        banks: dict[int, set[int]] = {}
        for a in lanes:
            for word in range(width // 4):
                banks.setdefault((a // 4 + word) % 32, set()).add(a // 4 + word)
        worst = max(worst, max(len(v) for v in banks.values()) - 1)
    return worst


@pytest.mark.parametrize("bk", [32, 64])
@pytest.mark.parametrize("rows", [64, 128])
def test_producer_stores_are_free_of_bank_conflicts(bk, rows):
    n = rows * bk // 4 // 128
    for warp in range(4):
        for copy in range(n):
            lanes = [warp * 32 + lane + copy * 128 for lane in range(32)]
            # K-contiguous operand (A n, B t): one 16-byte store per lane
            kc = [_swizzled(i // (bk // 4), (i % (bk // 4)) * 4, rows, bk) for i in lanes]
            assert _conflicts(kc, 16) == 0, (bk, rows, warp, copy, "k-contiguous")
            # M/N-contiguous operand (A t, B n): four word stores per lane, rows r + v
            kl = min(bk, 16)
            for v in range(4):
                words = []
                for i in lanes:
                    kk, rest = i % kl, i // kl
                    r, k = (rest % (rows // 4)) * 4, kk + kl * (rest // (rows // 4))
                    words.append(_swizzled(r + v, k, rows, bk))
                assert _conflicts(words, 4) == 0, (bk, rows, warp, copy, v, "transposed")


def test_swizzle_is_a_permutation_within_each_atom():
    for bk in (32, 64):
        for rows in (64, 128):
            offsets = {_swizzled(r, k, rows, bk) for r in range(rows) for k in range(0, bk, 4)}
            assert offsets == {4 * k + 4 * bk * r for r in range(rows) for k in range(0, bk, 4)} or \
                len(offsets) == rows * bk // 4


# PERSISTENT (LOADER=registers or presplit): the named configs that may take it, compiled in two layouts besides
PERSISTENT_NAMES = [n for n in NAMES if SPEC.space.named(n)["LOADER"] in ("registers", "presplit")
                    and SPEC.space.named(n)["SPLIT_K"] == 1]
GRID = [(n, layout, batched) for n in NAMES for layout in LAYOUTS for batched in (False, True)
        if batched is False or layout == "nn"]
GRID += [(n, layout, batched, True) for n in PERSISTENT_NAMES for layout in ("nn", "tt") for batched in (False, True)]


def _config(name: str, persistent: bool = False) -> dict:
    config = SPEC.space.named(name)
    return SPEC.space.with_overrides(config, {"PERSISTENT": True}) if persistent else config


def _coverage(case: tuple) -> set[tuple]:
    """What a case of GRID covers: each value of each parameter of its config, alone and in its layout,
    batched or not, persistent or not; that combination; and its named config outside plain nn."""
    name, layout, batched = case[:3]
    persistent = bool(case[3:])
    out = config_coverage(_config(name, persistent), layout=layout, batched=batched, persistent=persistent)
    if layout != "nn" or batched or persistent:
        out.add(("named elsewhere", name))
    return out


# A wgmma kernel takes about a second to compile (GRID's 115 were 107 CPU seconds of NVRTC 12.9, 2026-12-07):
# every named config in plain nn, and of the rest of GRID a covering set (tests/covering.py: greedy,
# deterministic) that compiles every value of every parameter in each layout, batched and not, persistent and
# not, where GRID does, and each named config in a transposed layout, batched or persistent at least once:
# 38 kernels, 36 CPU seconds.
CASES = covering(GRID, lambda c: c[1] == "nn" and not c[2] and not c[3:], _coverage)


def _render(name: str, layout: str, batched: bool, persistent: bool = False) -> str:
    spec = kernels.get("bmm") if batched else SPEC
    return spec.render(_config(name, persistent), "float32", layout)


@pytest.fixture(scope="module")
def compiled():
    import concurrent.futures

    if NVRTC_MISSING is not None:
        pytest.skip(NVRTC_MISSING)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {case: pool.submit(build.compile, _render(*case), "sm_90a") for case in CASES}
        return {case: f.result() for case, f in futures.items()}


@pytest.mark.slow
@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}{'-batched' if c[2] else ''}"
                                                   f"{'-persistent' if c[3:] else ''}")
def test_compiles_for_sm90a_within_the_register_model(compiled, case):
    name, layout = case[:2]
    result = compiled[case]
    assert result.arch == "sm_90a"
    # the product's function (LOADER=presplit adds its two split kernels, checked for spills too)
    (usage,) = [u for u in result.usages if not u.function.endswith(("_split_a", "_split_b"))]
    assert all(u.spill_stores == 0 for u in result.usages if u is not usage), result.usages
    derived = WGMMA.derive(SPEC.space.named(name), Problem(PROFILES["h100"], "float32", layout))
    assert usage.registers <= min(255, 65536 // derived["threads"] // 8 * 8)
    assert usage.spill_stores <= SPILL_BOUND.get(name, 0), (name, layout, usage)
    assert derived["regs_per_thread"] <= 255
    assert "C7508" not in result.log and "C7510" not in result.log, result.log  # setmaxnreg kept, wgmma not serialized


# NARROW_COPIES changes no register count (the same loads, fewer guards): its twins are left out
@pytest.mark.parametrize("config", [c for c in WGMMA.feasible(Problem(PROFILES["h100"], "float32", "nn"))
                                    if not c["NARROW_COPIES"]], ids=str)
def test_setmaxnreg_fits_the_blocks_registers(config):
    """More than 256 threads (two consumer or two producer warpgroups): setmaxnreg's new counts must fit
    the registers the block was launched with (65536 / threads a thread, rounded down to 8). An increase
    that cannot be met waits forever: with 224 / 144 at 384 threads (65536 > 64512 registers) the kernel
    hung on the H100."""
    derived = WGMMA.derive(config, Problem(PROFILES["h100"], "float32", "nn"))
    threads = derived["threads"]
    if threads == 256:
        return  # one consumer warpgroup: no setmaxnreg
    cap = 65536 // threads // 8 * 8
    producer, consumer = derived["producer_regs"], derived["consumer_regs"]
    assert producer % 8 == 0 and consumer % 8 == 0 and 24 <= min(producer, consumer) <= max(producer, consumer) <= 256
    producer_threads = 128 * config["PRODUCERS"]
    assert producer_threads * producer + (threads - producer_threads) * consumer <= cap * threads
    source = SPEC.render(config, "float32", "nn")
    for count in (producer, consumer):
        verb = "dec" if count < cap else "inc"
        assert f"setmaxnreg.{verb}.sync.aligned.u32 {count};" in source


def test_arch_specific_target_is_chosen_by_the_source():
    assert build.needs_arch_specific(_render("wgmma-64", "nn", False))
    assert not build.needs_arch_specific(SPEC.render(SPEC.space.named("tf32x3-128")))
    if NVRTC_MISSING is None:
        assert build.target_arch(90, True) == "sm_90a"
        assert build.target_arch(90) == "sm_90"
        with pytest.raises(CompileError):
            build.target_arch(80, True)


@pytest.mark.slow
@needs_nvrtc
@needs_sass
@pytest.mark.parametrize("name,layout", [("wgmma-128", "nn"), ("wgmma-64", "tt"), ("wgmma-128-k64", "nt")])
def test_sass_multiplies_with_hgmma_and_splits_in_the_producer_only(name, layout):
    sass = sass_of(_render(name, layout, False), "sm_90a")
    config = SPEC.space.named(name)
    bk, bm, bn = config["BK"], config["BM"], config["BN"]
    lines = sass.splitlines()
    hgmma = [i for i, line in enumerate(lines) if "HGMMA.64x" in line]
    assert len(hgmma) == 3 * bk // 8  # three products per k8 step, one warpgroup-wide instruction each
    assert all(f"HGMMA.64x{bn}x8.F32.TF32" in lines[i] for i in hgmma)
    # no conversion between the first and the last HGMMA of the K loop (the split is the producer's)
    assert not any("F2FP" in line for line in lines[hgmma[0]:hgmma[-1]])
    assert not any(("LDL" in line or "STL" in line) for line in lines[hgmma[0]:hgmma[-1]])
    # the producer's split: two TF32 roundings per element of its raw tile (edge path duplicates them)
    assert sum("F2FP.TF32" in line for line in lines) >= 2 * (bm + bn) * bk // 128
    assert "SYNCS.PHASECHK" in sass and "SYNCS.ARRIVE" in sass  # mbarrier waits and arrivals
    assert "WARPGROUP.DEPBAR" in sass
    if bm > 64:
        assert "USETMAXREG" in sass


# -- LOADER=presplit: the split kernels' workspace and the copies that read it -------------------------------

PRESPLIT = [n for n in NAMES if SPEC.space.named(n)["LOADER"] == "presplit"]


def test_presplit_configs_are_named_and_take_one_producer():
    assert {"wgmma-128-presplit", "wgmma-128x64-presplit", "wgmma-64-presplit"} <= set(PRESPLIT)
    problem = Problem(PROFILES["h200"], "float32", "nn")
    two = SPEC.space.with_overrides(SPEC.space.named("wgmma-64-presplit"), {"PRODUCERS": 2})
    assert not SPEC.space.is_feasible(two, problem)
    assert "wgmma presplit" in " ".join(SPEC.space.violations(two, problem))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(1000, 999, 997), (1, 7, 3), (3, 100, 50, 17)], ids=lambda s: "x".join(map(str, s)))
def test_presplit_launch_describes_the_workspace(layout, shape):
    """The four maps read the workspace (A big, A small, B big, B small): rows of 2 presplit_k floats, K
    of them read, presplit_k = K rounded up to 32 (each part's rows 128-byte aligned); a batch's maps count its
    matrices."""
    config = SPEC.space.named("wgmma-128x64-presplit")
    spec = kernels.get("bmm") if len(shape) == 4 else SPEC
    launch = spec.launch(config, shape, "float32", layout, sm_count=132)
    *batch, m, n, k = shape
    kp = -(-k // 32) * 32
    assert launch.presplit_k == kp == kernels.presplit_k(k) and kp % 32 == 0 and k <= kp < k + 32
    assert launch.presplit_transposed == (layout[0] == "t", layout[1] == "t")
    assert [box.operand for box in launch.tensor_maps] == [0, 1, 2, 3]
    for box, rows, box_rows in zip(launch.tensor_maps, (m, m, n, n), (128, 128, 64, 64), strict=True):
        assert (box.inner, box.outer, box.box_inner, box.box_outer) == (k, rows, 32, box_rows)
        assert box.row_elements == 2 * kp and box.element_bytes == 4
        assert box.batch == (batch[0] if batch else 0)
        assert box.describable(256, 0)  # every workspace part: 16-byte aligned rows at a 16-byte address


def test_tensor_map_rows_may_hold_more_than_the_map_reads():
    from autotile.codegen.tensor_map import TensorBox, dimensions

    box = TensorBox(1, 997, 50, 32, 64, 4, 0, 2 * 1000)
    assert dimensions(box) == ([997, 50], [8000], [32, 64])  # extents, byte strides, box
    batched = TensorBox(1, 997, 50, 32, 64, 4, 3, 2 * 1000)
    assert dimensions(batched, 100_000) == ([997, 50, 3], [8000, 400_000], [32, 64, 1])
    assert not TensorBox(0, 997, 50, 32, 64, 4, 0, 2 * 999).describable(256)  # rows not 16-byte multiples
    assert TensorBox(0, 997, 50, 32, 64).row_elements == 997  # no stride of its own: the rows are `inner` long


@pytest.mark.parametrize("layout", LAYOUTS)
def test_presplit_source_copies_split_tiles_and_holds_its_split_kernels(layout):
    config = SPEC.space.named("wgmma-128-presplit")
    source = SPEC.render(config, "float32", layout)
    for part in ("a", "b"):
        assert f"autotile_matmul_split_{part}(" in source
    assert "int use_tma" not in source  # no register path: the workspace is always describable
    # per stage, the four split tiles: BK / 32 copies of 32 floats each
    assert source.count("tma_load_2d(a_big") == source.count("tma_load_2d(b_small") == config["BK"] // 32
    assert "store_operand" not in source and "split_tf32(raw_" not in source  # the producer splits nothing
    # an operand stored M- or N-contiguous is transposed by its split kernel through shared memory
    assert ("__shared__ float tile[32][33]" in source) == (layout != "nt")


def test_presplit_copies_any_rows_at_one_width():
    from autotile.dispatch.model import copy_width

    assert copy_width(SPEC.space.named("wgmma-128-presplit"), 4) == 1
    assert copy_width(SPEC.space.named("wgmma-128-tma-p2"), 4) == 4


class _FakeKernel:
    """Stands in for a compiled kernel: records its launches (grid, block, arguments), CuPy's generic call's
    and packed ones alike."""

    def __init__(self, name: str):
        self.name = name
        self.launches: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
        self.siblings: dict[str, _FakeKernel] = {}

    def sibling(self, name: str) -> "_FakeKernel":
        return self.siblings.setdefault(name, _FakeKernel(name))

    def allow_dynamic_smem(self, nbytes: int) -> None:
        pass

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.launches.append((tuple(grid), tuple(block), tuple(int(a) for a in args)))

    def launch_packed(self, grid, block, shared_mem, stream_ptr, parameters):
        self.launches.append((tuple(grid), tuple(block), tuple(int(a) for a in parameters.arguments())))


@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_presplit_runner_splits_into_the_workspace_in_slices(layout):
    """What a LOADER=presplit call enqueues before its product, without a GPU: one workspace of (M + N) 2 kp
    floats, A's part first; each split kernel given its operand's rows, K, leading dimension and kp, a taller
    operand in slices of SPLIT_ROWS_PER_LAUNCH rows, each slice reading from its first row (A n: rows along K,
    A t: columns) and writing its own rows of the workspace; the four parts' addresses for the maps."""
    from autotile.runtime import impl

    m, n, k = 2 * impl.SPLIT_ROWS_PER_LAUNCH + 5, 9, 6
    kp = kernels.presplit_k(k)
    launch = SPEC.launch(SPEC.space.named("wgmma-64-presplit"), (m, n, k), "float32", layout, sm_count=132)
    product = _FakeKernel("autotile_matmul")
    runner = impl.KernelRunner(product, launch, SPEC.size_args((m, n, k)), False, 2)
    allocated = []
    base = 1 << 40

    def allocate(elems, dtype, stream_ptr):
        allocated.append((elems, dtype))
        return object(), base

    a_ptr, b_ptr = 1 << 32, 1 << 36
    _, parts, strides = runner._presplit((a_ptr, b_ptr), (), 0, allocate)
    assert allocated == [((m + n) * 2 * kp, "float32")]
    part_b = base + 4 * m * 2 * kp
    assert parts == (base, base + 4 * kp, part_b, part_b + 4 * kp) and strides == (0, 0, 0, 0)
    split_a, split_b = product.siblings["autotile_matmul_split_a"], product.siblings["autotile_matmul_split_b"]
    lda = k if layout[0] == "n" else m
    step = impl.SPLIT_ROWS_PER_LAUNCH
    expected = []
    for first in (0, step, 2 * step):
        height = min(step, m - first)
        source = a_ptr + 4 * (first * lda if layout[0] == "n" else first)
        expected.append(((1, -(-height // 32), 1), (32, 8, 1), (source, base + 8 * kp * first, height, k, lda, kp)))
    assert split_a.launches == expected
    assert split_b.launches == [((1, 1, 1), (32, 8, 1), (b_ptr, part_b, n, k, n, kp))]  # B n: K x N, ld N


def test_staged_store_only_where_asked_and_where_it_fits():
    """STORE=staged (wgmma) adds a path for C's rows that are not 8-byte aligned, through a buffer per consumer
    warp after the barriers (2.5 KB each, counted in smem_bytes); the default renders none. A tma loader of
    three raw stages has no room left for it, and K splits do not take it."""
    problem = Problem(PROFILES["h100"], "float32", "nn")
    for name in ("wgmma-128-persistent-p2", "wgmma-128", "wgmma-64-tma", "wgmma-128-presplit"):
        config = SPEC.space.with_overrides(SPEC.space.named(name), {"STORE": "staged"})
        assert SPEC.space.is_feasible(config, problem), name
        plain = SPEC.space.derive(SPEC.space.named(name), problem)["smem_bytes"]
        assert SPEC.space.derive(config, problem)["smem_bytes"] == plain + 160 * config["BM"] + 16
        for layout in LAYOUTS:
            assert SPEC.render(config, "float32", layout).count("C[(size_t)row * N + col] = buffer[r * 40 + lane]") == 1
            assert "store_buffers" not in SPEC.render(SPEC.space.named(name), "float32", layout)
    staged_tma = SPEC.space.with_overrides(SPEC.space.named("wgmma-128-tma-p2"), {"STORE": "staged"})
    assert not SPEC.space.is_feasible(staged_tma, problem)  # 224 KB of stages + 20 KB > 227 KB
    split = SPEC.space.with_overrides(SPEC.space.named("wgmma-64-split8"), {"STORE": "staged"})
    assert not SPEC.space.is_feasible(split, problem)


def test_persistent_blocks_go_through_the_units_of_every_matrix():
    """PERSISTENT wgmma: a line of at most one block per SM, the batch's size an argument (the grid no longer
    counts it); producer and consumers walk the same units; only LOADER=registers and presplit take it."""
    from autotile.runtime.impl import KernelRunner

    bmm = kernels.get("bmm")
    config = _config("wgmma-128", persistent=True)
    launch = bmm.launch(config, (300, 33, 65, 40), "float32", "nn", sm_count=132)
    assert launch.grid == (132, 1, 1) and launch.persistent_batch == 300
    assert bmm.launch(config, (2, 1, 1, 1), "float32", "nn", sm_count=132).grid == (2, 1, 1)  # one per unit
    single = SPEC.launch(config, (1031, 2050, 17), "float32", "nn", sm_count=132)
    assert single.grid == (132, 1, 1) and single.persistent_batch == 0
    # the non-persistent grid counts every tile of every matrix (z: the batch)
    assert bmm.launch(SPEC.space.named("wgmma-128"), (300, 33, 65, 40), "float32", "nn").grid == (1, 1, 300)

    source = _render("wgmma-128", "nn", True, persistent=True)
    assert source.count("for (int unit = blockIdx.x; unit < units; unit += gridDim.x)") == 2  # producer, consumers
    assert "int batch_count" in source and "units = tiles * batch_count" in source
    assert "int batch_count" not in _render("wgmma-128", "nn", False, persistent=True)
    assert "units" not in _render("wgmma-128", "nn", True)

    class StubKernel:  # what the runner's constructor touches of a compiled kernel
        max_dynamic_shared_size_bytes = 1 << 20

    runner = KernelRunner(StubKernel(), launch, bmm.size_args((300, 33, 65, 40)), batched=True)
    # A, B, C, M, N, K, the two batch strides, then the batch's size, written once
    assert runner.parameters.types[-1] == "int32" and len(runner.parameters.types) == 9
    problem = Problem(PROFILES["h100"], "float32", "nn")
    for name in NAMES:
        with_persistent = SPEC.space.with_overrides(SPEC.space.named(name), {"PERSISTENT": True})
        feasible = SPEC.space.is_feasible(with_persistent, problem)
        assert feasible == (name in PERSISTENT_NAMES), name
