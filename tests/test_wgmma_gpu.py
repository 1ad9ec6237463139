"""MATH=wgmma on a Hopper GPU (skipped elsewhere): every named wgmma config, odd shapes, all four layouts,
batched and split-K, against float64 with tf32x3's tolerance (kernels.tolerance), the output poisoned
before each run; the Inf/NaN pattern of special-value inputs equal to cuBLAS SGEMM's."""

from __future__ import annotations

import numpy as np
import pytest

from autotile.codegen import kernels

pytestmark = pytest.mark.gpu

MATMUL, BMM = kernels.get("matmul"), kernels.get("bmm")
NAMES = [n for n, c in MATMUL.space.named_configs.items() if c["MATH"] == "wgmma"]
SHAPES = [(1, 1, 1), (7, 13, 5), (61, 67, 71), (127, 129, 33), (128, 128, 32), (257, 131, 1031), (64, 250, 3)]
LAYOUTS = ("nn", "nt", "tn", "tt")


def _hopper():
    import cupy

    major = cupy.cuda.Device().compute_capability[0]
    if major != "9":
        pytest.skip("needs a Hopper GPU (sm_90)")


def _operands(rng, M, N, K, layout, batch=None):
    lead = () if batch is None else (batch,)
    a = rng.standard_normal((*lead, M, K)).astype(np.float32)
    b = rng.standard_normal((*lead, K, N)).astype(np.float32)
    return a, b


def _run(spec, config, a, b, layout):
    """C = A B through the generated kernel; A and B given as M x K and K x N (stored per `layout`)."""
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Generated

    M, K = a.shape[-2:]
    N = b.shape[-1]
    store_a = np.ascontiguousarray(np.swapaxes(a, -1, -2)) if layout[0] == "t" else a
    store_b = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if layout[1] == "t" else b
    shape = (M, N, K) if a.ndim == 2 else (a.shape[0], M, N, K)
    out = cupy.full((*a.shape[:-2], M, N), cupy.nan, dtype=cupy.float32)  # poisoned
    key = ProblemKey(spec.name, "float32", layout, shape)
    Generated(config).prepare(key).run((cupy.asarray(store_a), cupy.asarray(store_b)), out)
    return cupy.asnumpy(out)


def _check(c, a, b):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    K = a.shape[-1]
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    err = np.max(np.abs(c - ref) / np.maximum(scale, np.finfo(np.float32).tiny))
    assert np.all(np.isfinite(c)), "unwritten (NaN-poisoned) or non-finite outputs"
    assert err <= kernels.tolerance("float32", K), (err, kernels.tolerance("float32", K))


def _check_on(config, layout, shapes=(), batches=()):
    """`config` on each shape (M, N, K) as a matmul and each (batch, M, N, K) as a bmm, against float64."""
    for shape in shapes:
        rng = np.random.default_rng(sum(shape))
        a, b = _operands(rng, *shape, layout)
        _check(_run(MATMUL, config, a, b, layout), a, b)
    for batch, M, N, K in batches:
        rng = np.random.default_rng(batch + M + N + K)
        a, b = _operands(rng, M, N, K, layout, batch=batch)
        c = _run(BMM, config, a, b, layout)
        for i in range(batch):
            _check(c[i], a[i], b[i])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes_every_layout(name, layout, shape):
    _hopper()
    rng = np.random.default_rng(sum(shape))
    a, b = _operands(rng, *shape, layout)
    _check(_run(MATMUL, MATMUL.space.named(name), a, b, layout), a, b)


# (a persistent block takes no K splits: constraint "persistent blocks without K splits")
@pytest.mark.parametrize("name", [n for n in NAMES if not MATMUL.space.named(n)["PERSISTENT"]])
@pytest.mark.parametrize("split", [("atomic", 4), ("last_block", 8), ("last_block", 2)])
def test_split_k(name, split):
    _hopper()
    reduce, k = split
    config = MATMUL.space.with_overrides(MATMUL.space.named(name), {"SPLIT_K": k, "SPLIT_REDUCE": reduce})
    rng = np.random.default_rng(k)
    a, b = _operands(rng, 193, 77, 2049, "nn")
    _check(_run(MATMUL, config, a, b, "nn"), a, b)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_batched(name, layout):
    _hopper()
    rng = np.random.default_rng(5)
    a, b = _operands(rng, 67, 131, 45, layout, batch=3)
    c = _run(BMM, MATMUL.space.named(name), a, b, layout)
    for i in range(3):
        _check(c[i], a[i], b[i])


@pytest.mark.parametrize("name", NAMES)
# N = 192: LOADER=tma copies both operands; 190: rows of B are not 16-byte multiples (registers)
@pytest.mark.parametrize("N", [190, 192])
def test_special_values_match_cublas(name, N):
    """Inf, NaN, values near FLT_MAX and denormals: the non-finite pattern is SGEMM's (the exact path)."""
    _hopper()
    import cupy

    rng = np.random.default_rng(11)
    M, K = 200, 300
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    a[3, 7], a[150, 0], b[5, 100] = np.inf, np.nan, -np.inf
    a[80, :] *= np.float32(2.0**115)  # scaled operands past FLT_MAX: fast path Infs, exact path finite
    b[:, 20] = np.float32(2.0**-140)  # denormals
    c = _run(MATMUL, MATMUL.space.named(name), a, b, "nn")
    ref = cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b))  # cuBLAS SGEMM
    pattern = [np.isnan, np.isposinf, np.isneginf]
    for f in pattern:
        assert np.array_equal(f(c), f(ref)), f.__name__
    finite = np.isfinite(ref)
    ref64 = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    with np.errstate(invalid="ignore"):
        rel = np.abs(c - ref64)[finite] / np.maximum(scale[finite], np.finfo(np.float32).tiny)
    assert np.max(rel) <= kernels.tolerance("float32", K)


# PERSISTENT (LOADER=registers or presplit): a line of about one block per SM (132 on an H100 or H200) going
# through tile after tile, of one matrix or of every matrix of a batch, its stages' phases running on from tile to tile:
# shapes of many more tiles than SMs, with K of one step (17), a partial last step (200) and several (1031).
PERSISTENT_NAMES = [n for n in NAMES if MATMUL.space.named(n)["LOADER"] in ("registers", "presplit") and
                    MATMUL.space.named(n)["SPLIT_K"] == 1]
PERSISTENT_SHAPES = [(1031, 2050, 17), (777, 1283, 200), (61, 67, 1031), (1, 1, 1)]
PERSISTENT_BATCHES = [(300, 33, 65, 40), (7, 257, 131, 97), (2, 1, 1, 1), (40, 130, 260, 17)]


def _persistent(name, **extra):
    return MATMUL.space.with_overrides(MATMUL.space.named(name), {"PERSISTENT": True, **extra})


@pytest.mark.parametrize("name", PERSISTENT_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_persistent_blocks_go_through_many_tiles(name, layout):
    _hopper()
    _check_on(_persistent(name), layout, shapes=PERSISTENT_SHAPES)


# (three of the configs, two layouts: each case compiles a kernel of its own; presplit has one producer)
@pytest.mark.parametrize("name,producers", [("wgmma-128", 1), ("wgmma-128", 2), ("wgmma-64", 1), ("wgmma-64", 2),
                                            ("wgmma-128-presplit", 1)])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_persistent_blocks_go_through_every_matrix_of_a_batch(name, layout, producers):
    _hopper()
    _check_on(_persistent(name, PRODUCERS=producers), layout, batches=PERSISTENT_BATCHES)


# PRODUCERS=4: each producer thread loads a quarter of a tile (128 x 64 or 64 x 128: 12 floats; 64 x 64 with
# K steps of 64: 8) at 56 registers. The tile shapes four producers fit, with the register loader (and 128 x 64
# with the tma one), block per tile and persistent, on shapes with edges in M, N and K and on batches.
FOUR_PRODUCERS = [("wgmma-128x64", {}), ("wgmma-128x64-tma", {}), ("wgmma-64", {}),
                  ("wgmma-128x64", {"PERSISTENT": True}), ("wgmma-64", {"PERSISTENT": True}),
                  ("wgmma-128x64", {"BM": 64, "BK": 64, "STAGES": 3})]


@pytest.mark.parametrize("name,extra", FOUR_PRODUCERS, ids=lambda v: str(v))
@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_four_producers(name, extra, layout):
    _hopper()
    config = MATMUL.space.with_overrides(MATMUL.space.named(name), {"PRODUCERS": 4, **extra})
    _check_on(config, layout, shapes=PERSISTENT_SHAPES, batches=PERSISTENT_BATCHES[:2])


@pytest.mark.parametrize("name", ["wgmma-128", "wgmma-128-presplit"])
def test_persistent_special_values_match_cublas(name):
    """The exact path of a warp whose tile holds Inf or NaN, in a block that goes on to other tiles."""
    _hopper()
    import cupy

    rng = np.random.default_rng(12)
    batch, M, N, K = 40, 200, 190, 300
    a = rng.standard_normal((batch, M, K)).astype(np.float32)
    b = rng.standard_normal((batch, K, N)).astype(np.float32)
    a[3, 3, 7], a[17, 150, 0], b[29, 5, 100] = np.inf, np.nan, -np.inf
    a[5, 80, :] *= np.float32(2.0**115)  # scaled operands past FLT_MAX: fast path Infs, exact path finite
    c = _run(BMM, _persistent(name), a, b, "nn")
    ref = cupy.asnumpy(cupy.matmul(cupy.asarray(a), cupy.asarray(b)))  # cuBLAS's batched SGEMM
    for f in (np.isnan, np.isposinf, np.isneginf):
        assert np.array_equal(f(c), f(ref)), f.__name__
    finite = np.isfinite(ref)
    ref64 = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    rel = np.abs(c - ref64)[finite] / np.maximum(scale[finite], np.finfo(np.float32).tiny)
    assert np.max(rel) <= kernels.tolerance("float32", K)


# STORE=staged: where C's rows are not 8-byte aligned (N odd; in a batch, every other matrix too when M is
# odd), each consumer warp stores its rows through its buffer, 32 neighbours a row per instruction. Shapes of
# several tiles with N odd and edges in M, N and K; batches; both loaders that read registers, presplit, and
# a persistent block going on to other tiles after its store.
STAGED_NAMES = ["wgmma-128-persistent-p2", "wgmma-128", "wgmma-64-tma", "wgmma-128-presplit"]
STAGED_SHAPES = [(259, 263, 131), (300, 517, 97), (1, 33, 7), (130, 258, 66)]
STAGED_BATCHES = [(5, 131, 257, 97), (3, 257, 133, 130)]


def _staged(name):
    return MATMUL.space.with_overrides(MATMUL.space.named(name), {"STORE": "staged"})


@pytest.mark.parametrize("name", STAGED_NAMES)
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_staged_store_of_unaligned_rows(name, layout):
    _hopper()
    _check_on(_staged(name), layout, shapes=STAGED_SHAPES, batches=STAGED_BATCHES)


TMA_NAMES = [n for n in NAMES if MATMUL.space.named(n)["LOADER"] == "tma"]
# Every extent a multiple of 4 (rows of 16-byte multiples: the tensor maps describe them), none of a tile.
TMA_SHAPES = [(4, 8, 4), (132, 260, 36), (260, 4, 1028), (68, 132, 100)]


def _run_stored(config, store_a, store_b, layout, shape):
    """(C, whether the launch copied with tensor maps) for operands already stored per `layout`."""
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Generated

    M, N, _ = shape
    out = cupy.full((M, N), cupy.nan, dtype=cupy.float32)  # poisoned
    runner = Generated(config).prepare(ProblemKey("matmul", "float32", layout, shape))
    runner.run((store_a, store_b), out)
    return cupy.asnumpy(out), runner.uses_tensor_maps((int(store_a.data.ptr), int(store_b.data.ptr)))


@pytest.mark.parametrize("name", TMA_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", TMA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tma_copies_with_zero_filled_edges(name, layout, shape):
    """LOADER=tma on shapes the maps describe: the copies run (checked), and their zero fill past every
    edge leaves the result exact."""
    _hopper()
    import cupy

    rng = np.random.default_rng(sum(shape) + 1)
    a, b = _operands(rng, *shape, layout)
    store_a = cupy.asarray(np.ascontiguousarray(a.T) if layout[0] == "t" else a)
    store_b = cupy.asarray(np.ascontiguousarray(b.T) if layout[1] == "t" else b)
    c, copied = _run_stored(MATMUL.space.named(name), store_a, store_b, layout, shape)
    assert copied
    _check(c, a, b)


@pytest.mark.parametrize("name", TMA_NAMES)
def test_tma_misaligned_operand_loads_through_registers(name):
    """An operand 4 bytes past a 16-byte boundary cannot be described by a tensor map: the same kernel
    loads through registers, with a correct result; the aligned operands of the next call copy again."""
    _hopper()
    import cupy

    M, N, K = 132, 136, 260
    rng = np.random.default_rng(3)
    a, b = _operands(rng, M, N, K, "nn")
    backing = cupy.empty(M * K + 1, dtype=cupy.float32)
    shifted_a = backing[1:].reshape(M, K)  # 4 bytes past the allocation's start
    shifted_a[...] = cupy.asarray(a)
    c, copied = _run_stored(MATMUL.space.named(name), shifted_a, cupy.asarray(b), "nn", (M, N, K))
    assert not copied
    _check(c, a, b)
    c, copied = _run_stored(MATMUL.space.named(name), cupy.asarray(a), cupy.asarray(b), "nn", (M, N, K))
    assert copied
    _check(c, a, b)


@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
def test_presplit_splits_an_operand_taller_than_one_launch_takes(layout):
    """LOADER=presplit's split kernels take at most 65535 blocks of 32 rows a launch (grid y): a taller A is
    split in slices, each written at its own rows of the workspace (A n: rows along K; A t: columns)."""
    from autotile.runtime.impl import SPLIT_ROWS_PER_LAUNCH

    _hopper()
    rng = np.random.default_rng(11)
    a, b = _operands(rng, SPLIT_ROWS_PER_LAUNCH + 37, 9, 5, layout)
    _check(_run(MATMUL, MATMUL.space.named("wgmma-64-presplit"), a, b, layout), a, b)
