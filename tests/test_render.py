"""Rendering: golden files of the seed kernels, what the seeds look like, every sampled config renders,
rendering is pure, and a missing template variable is an error; the matmul layouts (nn, nt, tn, tt: A and B
row-major or stored transposed) and batched kernels, the nn source unchanged by them, and the tensor-core
kernels' fragment reads replayed for bank conflicts in every layout. No GPU.

Regenerate the golden files after an intended template change with::

    AUTOTILE_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import json
import os
import re
from pathlib import Path

import jinja2
import pytest

import autotile
from autotile.codegen import kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem

# `autotile.codegen.render` is the package's top-level function, which hides the submodule of the same name.
render_mod = importlib.import_module("autotile.codegen.render")

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("AUTOTILE_UPDATE_GOLDEN") == "1"

SEEDS = [("matmul", "seed-naive", "float32", "nn"), ("matmul", "seed-tiled16", "float32", "nn"),
         ("matmul", "seed-tiled32", "float32", "nn"), ("matvec", "seed-matvec-colmajor", "float32", "col")]
# Named configs beyond the seeds, so that a template change shows in review for every kernel family: the
# tensor-core kernel, split-K (atomic and last-block), the row-major matvec, and float64 (SIMT matmul, both
# matvec layouts).
GOLDEN_CONFIGS = SEEDS + [("matmul", "tf32x3-128", "float32", "nn"),
                          ("matmul", "regtile-64x128-splitk", "float32", "nn"),
                          ("matvec", "warp-per-row", "float32", "row"),
                          ("matmul", "regtile-128x64", "float64", "nn"),
                          ("matvec", "warp-per-row-vec2", "float64", "row"),
                          ("matvec", "col-vec2", "float64", "col"),
                          # split-K summed by the last block (SPLIT_REDUCE=last_block), each kernel family
                          ("matmul", "regtile-64-split8", "float32", "nn"),
                          ("matmul", "tf32x3-64-split8", "float32", "nn"),
                          ("matvec", "warp-per-row-split8", "float32", "row"),
                          ("matvec", "col-vec2-split8", "float64", "col")]
# The transposed layouts: each MATH kind (simt with A staged transposed and 16-byte loads, tf32x3, dmma) in
# nt, tn and tt.
GOLDEN_CONFIGS += [("matmul", name, dtype, layout) for name, dtype in (("regtile-128", "float32"),
                                                                      ("tf32x3-64", "float32"),
                                                                      ("dmma-64", "float64"))
                   for layout in ("nt", "tn", "tt")]
# Batched kernels (render's `batched`, under the kernel name "bmm"): split-K by the last block (the
# workspace and tickets of each batch) in nt, and atomic split-K in tn.
BATCHED_GOLDEN = [("matmul", "tf32x3-64-split8", "float32", "nt"), ("matmul", "regtile-64x128-splitk", "float32", "tn")]


def golden_name(kernel: str, config: str, dtype: str, layout: str, batched: bool = False) -> str:
    # matmul's nn was named "row" before the transposed layouts: its golden files keep their names
    stem = "row" if (kernel, layout) == ("matmul", "nn") else layout
    return f"{kernel}-{config}-{dtype}-{stem}{'-batched' if batched else ''}.cu"


def seed_source(kernel: str, name: str, dtype: str = "float32", layout: str | None = None) -> str:
    spec = kernels.get(kernel)
    layout = layout or ("nn" if kernel == "matmul" else "row")
    return spec.render(spec.space.named(name), dtype, layout)


def batched_source(name: str, dtype: str = "float32", layout: str = "nn", batched: bool = True,
                   config=None) -> str:
    """The matmul kernel of a named config (or `config`) rendered batched, as the caller does: kernel "bmm"."""
    spec = kernels.get("matmul")
    cfg = config if config is not None else spec.space.named(name)
    return render_mod.render(spec.space.template, "bmm", cfg, dtype, layout, spec.space.source_key(cfg),
                             spec.geometry(cfg, dtype, layout), batched=batched)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    if not path.is_file():
        pytest.fail(f"golden file {path} is missing; create it with AUTOTILE_UPDATE_GOLDEN=1", pytrace=False)
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), text.splitlines(keepends=True),
                                            fromfile=f"golden/{name}", tofile="rendered now"))
        pytest.fail(f"{name} differs from its golden file (AUTOTILE_UPDATE_GOLDEN=1 accepts the change):\n{diff}",
                    pytrace=False)


@pytest.mark.parametrize("kernel,name,dtype,layout", GOLDEN_CONFIGS, ids=[f"{s[1]}-{s[2]}" for s in GOLDEN_CONFIGS])
def test_named_config_matches_golden_file(kernel, name, dtype, layout):
    check_golden(golden_name(kernel, name, dtype, layout), seed_source(kernel, name, dtype, layout))


@pytest.mark.parametrize("kernel,name,dtype,layout", BATCHED_GOLDEN, ids=[f"{s[1]}-{s[3]}" for s in BATCHED_GOLDEN])
def test_batched_config_matches_golden_file(kernel, name, dtype, layout):
    check_golden(golden_name(kernel, name, dtype, layout, batched=True), batched_source(name, dtype, layout))


def test_golden_comparison_reports_a_unified_diff(monkeypatch):
    # The comparison itself: a changed line fails with a diff that shows it (skipped while regenerating).
    if UPDATE:
        pytest.skip("regenerating golden files")
    text = seed_source("matmul", "seed-tiled16").replace("__syncthreads();  // the tile", "/* gone */  // the tile")
    with pytest.raises(pytest.fail.Exception) as info:
        check_golden(golden_name("matmul", "seed-tiled16", "float32", "nn"), text)
    message = str(info.value)
    assert "--- golden/matmul-seed-tiled16-float32-row.cu" in message and "+++ rendered now" in message
    assert re.search(r"^-\s+__syncthreads\(\);  // the tile", message, re.M)
    assert re.search(r"^\+\s+/\* gone \*/", message, re.M)


def test_golden_files_are_the_only_ones():
    if UPDATE:
        pytest.skip("regenerating golden files")
    expected = {golden_name(*s) for s in GOLDEN_CONFIGS} | {golden_name(*s, batched=True) for s in BATCHED_GOLDEN}
    assert {p.name for p in GOLDEN.glob("*.cu")} == expected


# -- what the seeds look like ----------------------------------------------------------------------

def test_seed_naive_uses_no_shared_memory():
    src = seed_source("matmul", "seed-naive")
    assert "__shared__" not in src
    assert "__syncthreads" not in src
    assert re.search(r"for \(int k = k_begin; k < k_end; \+\+k\)", src)  # the plain loop over K
    assert "A[(size_t)row * K + k]" in src and "B[(size_t)k * N + col]" in src
    assert "__launch_bounds__(256)" in src


@pytest.mark.parametrize("name,tile", [("seed-tiled16", 16), ("seed-tiled32", 32)])
def test_seed_tiled_uses_static_shared_tiles(name, tile):
    src = seed_source("matmul", name)
    assert "extern __shared__" not in src
    assert "using T = float;" in src
    assert re.search(r"__shared__ __align__\(16\) T As\[STAGES \* A_TILE\];", src)
    assert re.search(r"__shared__ __align__\(16\) T Bs\[STAGES \* B_TILE\];", src)
    assert src.count("__syncthreads()") == 2  # after the store and after the multiply
    assert re.search(r"for \(int t = 0; t < n_tiles; \+\+t\) \{", src)  # the loop over K tiles
    assert f"constexpr int BM = {tile}, BN = {tile}, TM = 1, TN = 1;" in src
    assert f"constexpr int BK = {tile}, VEC = 1, STAGES = 1;" in src
    assert f"__launch_bounds__({tile * tile})" in src
    assert "atomicAdd" not in src  # no split-K


def test_seed_matvec_colmajor_uses_dynamic_shared_memory():
    src = seed_source("matvec", "seed-matvec-colmajor", layout="col")
    assert "extern __shared__" in src
    assert "column-major" in src
    assert "a_shared[i] = (gr < M && c < len) ? A[(size_t)(kt + c) * M + gr]" in src  # the staged A tile
    assert "x_shared[i] = x[kt + i]" in src
    assert "__launch_bounds__(256)" in src
    assert "__shfl_xor_sync" not in src  # the row-major reduction is not there


def test_float64_renders_double():
    src = seed_source("matmul", "seed-tiled16", "float64")
    assert "using T = double;" in src
    assert "const T* __restrict__ A" in src and "__shared__ __align__(16) T As" in src
    assert not re.search(r"\bfloat\b", src)


# -- every config renders --------------------------------------------------------------------------

CASES = [(k, lay, dt) for k, layouts in (("matmul", ("nn", "nt", "tn", "tt")), ("matvec", ("row", "col")))
         for lay in layouts for dt in ("float32", "float64")]
# Sampling the matmul space takes time (about 50 ms a config): the transposed layouts, whose constraints
# are nn's but for the tensor-core tiles' shared memory, render nn's sample (each config under its own
# layout's derived values).
TRANSPOSED = ("nt", "tn", "tt")


def _sample(kernel: str, layout: str, dtype: str, n: int, seed: int) -> tuple:
    return _sample_as(kernel, "nn" if layout in TRANSPOSED else layout, dtype, n, seed)


@functools.lru_cache(maxsize=None)
def _sample_as(kernel: str, layout: str, dtype: str, n: int, seed: int) -> tuple:
    return tuple(kernels.get(kernel).space.sample(Problem(PROFILES["h100"], dtype, layout), n, seed=seed))


def _drawn(kernel: str, layout: str, dtype: str) -> tuple:
    """One sample of 400 configs per case, shared by the tests below (each takes its own slice): a draw costs
    seconds whatever its size (100,000 rejection draws, then walks of the space), a slice nothing."""
    return _sample(kernel, layout, dtype, 400, 99)


@pytest.mark.parametrize("kernel,layout,dtype", CASES)
def test_sampled_configs_render(kernel, layout, dtype):
    spec = kernels.get(kernel)
    space = spec.space
    prob = Problem(PROFILES["h100"], dtype, layout)
    configs = _drawn(kernel, layout, dtype)[:60]
    assert len(configs) == 60
    kinds = set()
    for cfg in configs:
        src = spec.render(cfg, dtype, layout)
        d = space.derive(cfg, prob)
        kinds.add(cfg["smem"])
        bounds = rf'__launch_bounds__\({d["threads"]}(, 1)?\)'
        assert re.search(rf'extern "C" __global__ void {bounds}[^\n]*\nautotile_{kernel}\(', src)
        assert f"// config: {space.source_key(cfg)}\n" in src
        assert src.count("{") == src.count("}")
        assert "Undefined" not in src and "None" not in src
        # skinny declares shared memory only where its rows of threads meet there (B row-major)
        uses_shared = cfg["smem"] != "none" and (cfg.get("MATH") != "skinny" or d["smem_bytes"] > 0)
        assert ("extern __shared__" in src) == (uses_shared and cfg["smem"] == "dynamic")
        assert ("__shared__" in src) == uses_shared
        assert ("atomicAdd" in src) == (cfg["SPLIT_K"] > 1)
        assert re.search(r"\bdouble\b", src) if dtype == "float64" else not re.search(r"\bdouble\b", src)
    assert {"static", "dynamic"} <= kinds  # (column-major configs without shared memory are rare)


def _dynamic_bytes(kernel: str, src: str, cfg, dtype_size: int) -> int:
    """The dynamic shared memory the rendered kernel indexes, read from its constants."""
    wgmma = re.search(r"constexpr int BM = (\d+), BN = (\d+), BK = (\d+), STAGES = (\d+);", src)
    if kernel == "matmul" and "(wgmma)" in src.splitlines()[0] and wgmma:
        # big and small parts of both tiles per stage, 1024 bytes to align the base, two mbarriers a stage
        bm, bn, bk, stages = (int(g) for g in wgmma.groups())
        assert "STAGE_BYTES = 2 * (A_BYTES + B_BYTES)" in src
        if "constexpr int SPLIT_STAGES = 2;" in src:  # LOADER=tma: two split stages, then STAGES raw ones
            assert "RAW_BYTES = A_BYTES + B_BYTES" in src and "raw = base + SPLIT_STAGES * STAGE_BYTES" in src
            assert "bars = raw + STAGES * RAW_BYTES" in src  # then 2 x 2 split-stage and STAGES raw mbarriers
            return (2 * 2 + stages) * (bm + bn) * bk * dtype_size + 1024 + 8 * (4 + stages)
        assert "base + STAGES * STAGE_BYTES" in src
        return stages * 2 * (bm + bn) * bk * dtype_size + 1024 + 16 * stages
    if kernel == "matmul" and ", short M:" in src.splitlines()[0]:  # skinny: [THREADS_K][BM][BN] partial sums
        if "extern __shared__" not in src:
            return 0
        threads_k = re.search(r"constexpr int THREADS_K = (\d+),", src)
        assert threads_k, src
        return int(threads_k.group(1)) * cfg["BM"] * cfg["BN"] * dtype_size
    if kernel == "matmul":
        a = re.search(r"constexpr int A_STRIDE = (\d+), A_TILE = (\d+) \* A_STRIDE;", src)
        b = re.search(r"constexpr int B_STRIDE = (\d+), B_TILE = (BK|BN) \* B_STRIDE;", src)
        stages = re.search(r"STAGES = (\d+);", src)
        assert a and b and stages, src
        elems = int(a.group(1)) * int(a.group(2)) + cfg[b.group(2)] * int(b.group(1))
        return int(stages.group(1)) * elems * dtype_size
    x = re.search(r"a_shared = x_shared \+ (\d+);", src)
    a = re.search(r"partial = a_shared \+ (\d+);", src)
    r = re.search(r"reduction \[(\d+)\]", src)
    assert x and a, src
    return (int(x.group(1)) + int(a.group(1)) + (int(r.group(1)) if r else 0)) * dtype_size


@pytest.mark.parametrize("kernel,layout,dtype", CASES)
def test_dynamic_shared_memory_matches_model_and_launch(kernel, layout, dtype):
    """ptxas cannot see dynamic shared memory: the size the kernel indexes must be what the model computes
    and what the launch requests."""
    spec = kernels.get(kernel)
    space = spec.space
    prob = Problem(PROFILES["h100"], dtype, layout)
    shape = (1000, 900, 800)[:len(spec.dims)]
    dynamic = [c for c in _drawn(kernel, layout, dtype) if c["smem"] == "dynamic"][:40]
    if kernel == "matmul":  # and the named configs with dynamic shared memory, of every MATH kind
        dynamic += [c for c in space.named_configs.values() if c["smem"] == "dynamic" and space.is_feasible(c, prob)]
    assert len(dynamic) >= 10
    for cfg in dynamic:
        src = spec.render(cfg, dtype, layout)
        model = space.derive(cfg, prob)["smem_bytes"]
        assert _dynamic_bytes(kernel, src, cfg, prob.names()["dtype_size"]) == model, cfg.key()
        assert spec.launch(cfg, shape, dtype, layout).dynamic_smem_bytes == model
    others = [c for c in _drawn(kernel, layout, dtype) if c["smem"] != "dynamic"][:20]
    assert others
    for cfg in others:
        assert spec.launch(cfg, shape, dtype, layout).dynamic_smem_bytes == 0


def test_top_level_render_checks_and_matches():
    assert autotile.render("matmul", "seed-tiled32") == seed_source("matmul", "seed-tiled32")
    assert (autotile.render("matvec", "seed-matvec-colmajor", layout="col", device="p100")
            == seed_source("matvec", "seed-matvec-colmajor", layout="col"))
    src = autotile.render("matmul", "seed-tiled16", BM="32", TM="2")
    assert "constexpr int BM = 32, BN = 16, TM = 2, TN = 1;" in src
    with pytest.raises(autotile.InfeasibleConfigError, match="static shared memory per block"):
        autotile.render("matmul", "seed-tiled32", device="p100", BM=256, BN=256, BK=64, TM=8, TN=8)


# -- purity and strictness -------------------------------------------------------------------------

def test_render_is_pure():
    spec = kernels.get("matmul")
    a, b = spec.space.named("seed-tiled16"), spec.space.named("regtile-128")
    first = spec.render(a)
    other = spec.render(b, "float64")
    assert first != other
    assert spec.render(a) == first  # the same text, also after another config and dtype
    assert spec.render(b, "float64") == other
    # a plain dict is as good as a Config
    assert render_mod.render("matmul.cu.j2", "matmul", dict(a), config_key=spec.space.source_key(a),
                             geometry=spec.geometry(a)) == first
    assert dict(a) == dict(spec.space.named("seed-tiled16"))  # rendering changed nothing


def test_missing_template_variable_is_an_error():
    spec = kernels.get("matmul")
    config = spec.space.named("seed-tiled16")
    cfg, geometry = dict(config), spec.geometry(config)
    for name in ("BN", "smem", "SPLIT_K", "UNROLL", "PAD"):
        partial = {k: v for k, v in cfg.items() if k != name}
        with pytest.raises(jinja2.UndefinedError, match=f"'{name}' is undefined"):
            render_mod.render("matmul.cu.j2", "matmul", partial, geometry=geometry)
    for name in ("threads", "block_x", "a_stride"):  # the geometry is needed too
        with pytest.raises(jinja2.UndefinedError, match=f"'{name}' is undefined"):
            render_mod.render("matmul.cu.j2", "matmul", cfg, geometry={k: v for k, v in geometry.items() if k != name})
    mv_spec = kernels.get("matvec")
    mv_config = mv_spec.space.named("seed-matvec-colmajor")
    mv = dict(mv_config)
    del mv["TILE_K"]
    with pytest.raises(jinja2.UndefinedError, match="TILE_K"):
        render_mod.render("matvec.cu.j2", "matvec", mv, "float32", "col",
                          geometry=mv_spec.geometry(mv_config, "float32", "col"))


def test_environment_is_strict():
    env = render_mod.environment()
    assert env.undefined is jinja2.StrictUndefined
    assert env is render_mod.environment()


def _strides(src: str) -> tuple[int, int]:
    a = re.search(r"constexpr int A_STRIDE = (\d+), A_TILE", src)
    b = re.search(r"constexpr int B_STRIDE = (\d+), B_TILE", src)
    assert a and b, src
    return int(a.group(1)), int(b.group(1))


# -- the tensor-core kernels' fragment reads, replayed for bank conflicts -----------------------------

MATMUL_LAYOUTS = ("nn", "nt", "tn", "tt")
LANES = [(lane // 4, lane % 4) for lane in range(32)]  # (group, quad) of the mma fragments

# Each fragment read of one warp, as the templates write it, for an operand stored n or t: the text of the
# read in the kernel (with its base pointer, which holds this lane's part of the offset), the element
# offset each lane (group g, quad q) reads for a stride S, and how many elements one read takes. The
# constant parts of an offset (row tile i, step kk, row group + 8, k + 1) move every lane's address by the
# same amount and change no conflict; the replay takes some of them anyway.
FRAGMENT_READS = {
    # tf32x3: mma k index q at tile k 2 (q % 4) + q / 4, so a lane takes k = 2 quad and 2 quad + 1
    ("tf32x3", "a", False): (["(warp_row + group) * A_STRIDE + 2 * quad", "as + (i * 16) * A_STRIDE + kk",
                              "as + (i * 16 + 8) * A_STRIDE + kk"],
                             [lambda g, q, S, r=r: (g + r) * S + 2 * q for r in (0, 8)], 2),
    ("tf32x3", "a", True): (["2 * quad * A_STRIDE + warp_row + group", "as[kk * A_STRIDE + i * 16]",
                             "as[(kk + 1) * A_STRIDE + i * 16 + 8]"],
                            [lambda g, q, S, r=r, k=k: (2 * q + k) * S + g + r for r in (0, 8) for k in (0, 1)], 1),
    ("tf32x3", "b", False): (["2 * quad * B_STRIDE + warp_col + group", "bs[kk * B_STRIDE + j * 8]",
                              "bs[(kk + 1) * B_STRIDE + j * 8]"],
                             [lambda g, q, S, k=k: (2 * q + k) * S + g for k in (0, 1)], 1),
    ("tf32x3", "b", True): (["(warp_col + group) * B_STRIDE + 2 * quad", "bs + j * 8 * B_STRIDE + kk"],
                            [lambda g, q, S: g * S + 2 * q], 2),
    # dmma: a lane takes k = quad (of each 4-deep step), 8 bytes per read
    ("dmma", "a", False): (["(warp_row + group) * A_STRIDE + quad", "as[(i * 16) * A_STRIDE + kk + 4 * q]",
                            "as[(i * 16 + 8) * A_STRIDE + kk + 4 * q]"],
                           [lambda g, q, S, r=r: (g + r) * S + q for r in (0, 8)], 1),
    ("dmma", "a", True): (["quad * A_STRIDE + warp_row + group", "as[(kk + 4 * q) * A_STRIDE + i * 16]",
                           "as[(kk + 4 * q) * A_STRIDE + i * 16 + 8]"],
                          [lambda g, q, S, r=r: q * S + g + r for r in (0, 8)], 1),
    ("dmma", "b", False): (["quad * B_STRIDE + warp_col + group", "bs[(kk + 4 * q) * B_STRIDE + j * 8]"],
                           [lambda g, q, S: q * S + g], 1),
    ("dmma", "b", True): (["(warp_col + group) * B_STRIDE + quad", "bs[j * 8 * B_STRIDE + kk + 4 * q]"],
                          [lambda g, q, S: g * S + q], 1),
}


def conflict_free(offsets: list[int], elem_bytes: int, elems: int) -> bool:
    """Whether one warp's shared-memory read (lane i reads `elems` elements from element offsets[i]) is
    served without bank conflicts: a read of 8 bytes per lane is served by half-warps, of 16 bytes by
    quarter-warps, each phase 128 bytes, and each phase's 4-byte words must fall in different banks."""
    words = elem_bytes * elems // 4
    per_phase = 32 // words
    for first in range(0, 32, per_phase):
        banks = [(o * elem_bytes // 4 + w) % 32 for o in offsets[first:first + per_phase] for w in range(words)]
        if len(set(banks)) != len(banks):
            return False
    return True


def test_bank_replay_sees_a_conflict():
    # the replay itself: rows 32 floats apart put a column in one bank; 8-byte reads of two k's 16 apart clash
    assert not conflict_free([g * 32 + q for g, q in LANES], 4, 1)
    assert conflict_free([g * 36 + q for g, q in LANES], 4, 1)
    assert not conflict_free([g * 16 + 2 * q for g, q in LANES], 4, 2)
    assert conflict_free([g * 24 + 2 * q for g, q in LANES], 4, 2)


@pytest.mark.parametrize("math", ["tf32x3", "dmma"])
@pytest.mark.parametrize("layout", MATMUL_LAYOUTS)
def test_fragment_reads_are_free_of_bank_conflicts(math, layout):
    """The strides the tensor-core templates pick, for every K step and tile width, replayed for one warp:
    each fragment read of A and of B, as the kernel of this layout indexes its shared tiles (checked
    against the rendered source), touches every bank once per phase."""
    spec = kernels.get("matmul")
    base, dtype = ("tf32x3-128", "float32") if math == "tf32x3" else ("dmma-64", "float64")
    elem_bytes = 4 if math == "tf32x3" else 8
    trans = {"a": layout[0] == "t", "b": layout[1] == "t"}
    seen = set()
    for bk in (8, 16, 32, 64):
        for bm, bn in ((16, 256), (32, 128), (64, 64), (128, 32), (256, 16)):
            config = spec.space.with_overrides(spec.space.named(base), {"BK": bk, "BM": bm, "BN": bn, "WM": 16,
                                                                        "WN": 16, "MMA_K": 4})
            src = spec.render(config, dtype, layout)
            a_stride, b_stride = _strides(src)
            strides = {"a": a_stride, "b": b_stride}
            code = _code(src)
            for operand in "ab":
                texts, reads, elems = FRAGMENT_READS[(math, operand, trans[operand])]
                for text in texts:
                    assert text in code, (math, layout, operand, text)
                stride = strides[operand]
                seen.add((operand, stride))
                for read in reads:
                    offsets = [read(g, q, stride) for g, q in LANES]
                    assert conflict_free(offsets, elem_bytes, elems), (math, layout, operand, bk, bm, bn, stride)
    # the strides follow the contiguous dimension's tile size: BK for A n and B t, BM for A t, BN for B n
    assert len({s for o, s in seen if o == "a"}) >= 4 and len({s for o, s in seen if o == "b"}) >= 4


@pytest.mark.parametrize("wn", [16, 32, 64])
def test_tf32x3_staged_store_where_asked_and_free_of_bank_conflicts(wn):
    """STORE=staged (tf32x3): each warp's buffer rows lie min(WN, 32) + 8 floats apart, so that a half-warp's
    pair writes (rows group and group + 8, columns 2 quad) touch every bank once; the default renders no
    buffer; K splits and a stage too small for the buffers do not take it."""
    spec = kernels.get("matmul")
    problem = Problem(PROFILES["h100"], "float32", "nn")
    config = spec.space.with_overrides(spec.space.named("tf32x3-64"), {"WN": wn, "STORE": "staged"})
    assert spec.space.is_feasible(config, problem)
    slice_ = min(wn, 32)
    for layout in MATMUL_LAYOUTS:
        src = spec.render(config, "float32", layout)
        assert f"buffer + (h * 8 + group) * {slice_ + 8} + jj * 8 + 2 * quad" in src
        assert f"= buffer[r * {slice_ + 8} + c]" in src and "__syncthreads();  // every warp is done" in src
        assert "buffer" not in spec.render(spec.space.named("tf32x3-64"), "float32", layout)
    for h in (0, 1):
        assert conflict_free([(h * 8 + g) * (slice_ + 8) + 2 * q for g, q in LANES], 4, 2)
    split = spec.space.with_overrides(spec.space.named("tf32x3-64-split8"), {"STORE": "staged"})
    assert not spec.space.is_feasible(split, problem)
    small = spec.space.with_overrides(config, {"BK": 8, "STAGES": 1})  # A's stage: 64 x (8 + pad) floats
    assert not spec.space.is_feasible(small, problem)


def test_tensor_core_strides_per_layout():
    """The paddings per layout (the replay above proves them conflict-free): tf32x3 pads a row holding a
    lane's two k's side by side (A n, B t) to 8 mod 16 floats (BK = 8 needs none), a row indexed by k
    (A t, B n) to 4 mod 16; dmma pads every row by 4 doubles. A t is staged [BK][BM + pad], B t [BN][BK + pad]."""
    spec = kernels.get("matmul")
    tf = spec.space.with_overrides(spec.space.named("tf32x3-128"), {"BK": 32})  # BM = BN = 128
    dm = spec.space.with_overrides(spec.space.named("dmma-64"), {"BK": 16})  # BM = BN = 64
    expected = {("tf32x3", "nn"): (40, 128, 132, 32), ("tf32x3", "nt"): (40, 128, 40, 128),
                ("tf32x3", "tn"): (132, 32, 132, 32), ("tf32x3", "tt"): (132, 32, 40, 128),
                ("dmma", "nn"): (20, 64, 68, 16), ("dmma", "nt"): (20, 64, 20, 64),
                ("dmma", "tn"): (68, 16, 68, 16), ("dmma", "tt"): (68, 16, 20, 64)}
    for (math, layout), (a_stride, a_rows, b_stride, b_rows) in expected.items():
        cfg, dtype = (tf, "float32") if math == "tf32x3" else (dm, "float64")
        g = spec.geometry(cfg, dtype, layout)
        assert (g["a_stride"], g["a_rows"], g["b_stride"], g["b_rows"]) == (a_stride, a_rows, b_stride, b_rows)
        src = spec.render(cfg, dtype, layout)
        assert f"constexpr int A_STRIDE = {a_stride}, A_TILE = {a_rows} * A_STRIDE;" in src
        b_rows_name = "BN" if layout[1] == "t" else "BK"
        assert f"constexpr int B_STRIDE = {b_stride}, B_TILE = {b_rows_name} * B_STRIDE;" in src
        size = 4 if dtype == "float32" else 8
        assert g["smem_bytes"] == cfg["STAGES"] * (a_rows * a_stride + b_rows * b_stride) * size


def _code(src: str) -> str:
    """The source without its // comments: what the compiler sees of it."""
    return "\n".join(line.split("//", 1)[0] for line in src.splitlines())


def test_tf32x3_renders_tensor_core_code_and_simt_does_not():
    spec = kernels.get("matmul")
    tc = _code(spec.render(spec.space.named("tf32x3-128")))
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in tc and "cp.async.cg.shared.global" in tc
    # the split works on the scaled operand, rounds with cvt.rn from sm_90 and on the bits before (never
    # with cvt.rna, 4 instructions), and each tile's partial sums are added outside the tensor cores
    assert "const float scaled = x * SCALE;" in tc and "cvt.rn.tf32.f32" in tc and "cvt.rna" not in tc
    assert "(__float_as_uint(scaled) + 0x1000u) & 0xffffe000u" in tc
    assert "acc[i][j][v] += part[i][j][v]" in tc
    # a block whose fast result is not finite computes its tile again with FMAs; the others scale back
    assert "if (__syncthreads_or(suspect))" in tc and "run_k_loop(multiply_tile_exact)" in tc
    assert "fmaf(a[i][v / 2], b[j][v % 2], part[i][j][v])" in tc and "acc[i][j][v] *= UNSCALE" in tc
    simt = _code(spec.render(spec.space.named("regtile-128")))
    assert "mma.sync" not in simt and "cp.async" not in simt


@pytest.mark.parametrize("kernel,layout,dtype", CASES)
def test_template_and_launcher_read_one_geometry(kernel, layout, dtype):
    """The block the launcher asks for is the space's derived block, and the kernel declares the same
    number of threads in its launch bounds; both come from `KernelSpec.geometry`."""
    spec = kernels.get(kernel)
    prob = Problem(PROFILES["h100"], dtype, layout)
    configs = _drawn(kernel, layout, dtype)[60:90]
    assert len(configs) == 30
    for cfg in configs:
        g = spec.geometry(cfg, dtype, layout)
        launch = spec.launch(cfg, (1000, 900, 800)[:len(spec.dims)], dtype, layout)
        assert launch.block == (g["block_x"], g["block_y"], 1)
        assert g["block_x"] * g["block_y"] == g["threads"] == spec.space.derive(cfg, prob)["threads"]
        assert re.search(rf"__launch_bounds__\({g['threads']}(, 1)?\)", spec.render(cfg, dtype, layout))


# -- layouts and batched kernels ---------------------------------------------------------------------

HASHES = Path(__file__).parent / "data" / "matmul_nn_source_hashes.json"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_nn_sources_are_those_of_before_the_layouts():
    """Tuned records are keyed by a hash of the rendered source: the layout nn, unbatched, must render every
    named config byte for byte as the templates did before the layouts and the batched flag existed (the
    hashes were recorded from that tree, commit 44f53fa, with the layout then called row)."""
    recorded = json.loads(HASHES.read_text())
    spec = kernels.get("matmul")
    assert len(recorded) >= 30
    for key, digest in recorded.items():
        name, dtype = key.split("/")
        cfg = spec.space.named(name)
        assert _sha(spec.render(cfg, dtype, "nn")) == digest, key
        explicit = render_mod.render(spec.space.template, "matmul", cfg, dtype, "nn", spec.space.source_key(cfg),
                                     spec.geometry(cfg, dtype, "nn"), batched=False)
        assert _sha(explicit) == digest, key


def _batched_cases() -> list[tuple[str, str, object]]:
    """(dtype, layout, config): named configs of each MATH kind and split-K reduction, and a sample."""
    spec = kernels.get("matmul")
    named = ["seed-naive", "safe-default", "regtile-64x128-splitk", "regtile-64-split8", "tf32x3-128",
             "tf32x3-64-split8", "dmma-64", "dmma-64-split8"]
    out = []
    for i, name in enumerate(named):
        cfg = spec.space.named(name)
        dtype = "float64" if cfg["MATH"] == "dmma" else "float32"
        out.append((dtype, MATMUL_LAYOUTS[i % 4], cfg))
    for layout in MATMUL_LAYOUTS:
        for dtype in ("float32", "float64"):
            out += [(dtype, layout, c) for c in _drawn("matmul", layout, dtype)[90:120:5]]
    return out


def test_batched_kernel_abi():
    """Batched: the batch strides right after the sizes, then the split-K buffers; blockIdx.z decoded once
    into batch and split (z = batch * SPLIT_K + split) and read nowhere else; A, B, C and the split-K buffers
    offset to the batch before anything reads them. Unbatched: none of it."""
    for dtype, layout, cfg in _batched_cases():
        split_k, last_block = cfg["SPLIT_K"], cfg["SPLIT_REDUCE"] == "last_block"
        src = batched_source("", dtype, layout, config=cfg)
        code = _code(src)
        buffers = ", T* __restrict__ partials, unsigned int* __restrict__ tickets" if last_block else ""
        assert ("autotile_bmm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,\n"
                f"                 int M, int N, int K, long long stride_a, long long stride_b{buffers})") in code
        if split_k > 1:
            assert f"const int split = blockIdx.z % {split_k}, batch = blockIdx.z / {split_k};" in code
            assert code.count("blockIdx.z") == 2, cfg.key()
            assert re.search(r"\bsplit\b", code.split("const int split =", 1)[1]), cfg.key()  # used
        else:
            assert "const int batch = blockIdx.z;" in code and code.count("blockIdx.z") == 1
            assert not re.search(r"\bsplit\b", code)
        body = code[code.index("autotile_bmm("):]
        decode = body.index("batch = blockIdx.z")
        for line in ("A += batch * stride_a;", "B += batch * stride_b;", "C += (size_t)batch * M * N;"):
            assert code.count(line) == 1 and decode < body.index(line) < body.index("const int row0"), cfg.key()
            assert "aligned_to(" not in body[:body.index(line)]
        assert ("partials += (size_t)batch * %d * M * N;" % split_k in code) == last_block
        tiles = "(((M + %d) / %d) * ((N + %d) / %d))" % (cfg["BM"] - 1, cfg["BM"], cfg["BN"] - 1, cfg["BN"])
        assert (f"tickets += (size_t)batch * {tiles};" in code) == last_block
        plain = _code(batched_source("", dtype, layout, batched=False, config=cfg))
        assert "stride_a" not in plain and not re.search(r"\bbatch\b", plain)
        assert plain.count("blockIdx.z") == (0 if split_k == 1 else 3 if last_block else 1), cfg.key()


def test_layouts_index_the_operands_as_stored():
    """What each layout's kernel reads: A (m, k) at A[m*K + k] (n) or A[k*M + m] (t), B (k, n) at
    B[k*N + n] (n) or B[n*K + k] (t); vector loads checked along the contiguous dimension."""
    spec = kernels.get("matmul")
    naive = spec.space.named("seed-naive")
    reads = {"n": ("A[(size_t)row * K + k]", "B[(size_t)k * N + col]"),
             "t": ("A[(size_t)k * M + row]", "B[(size_t)col * K + k]")}
    for layout in MATMUL_LAYOUTS:
        src = spec.render(naive, "float32", layout)
        assert reads[layout[0]][0] in src and reads[layout[1]][1] in src
        for name in ("regtile-128", "tf32x3-128"):
            code = _code(spec.render(spec.space.named(name), "float32", layout))
            assert f"a_vector_ok = ({'M' if layout[0] == 't' else 'K'} % VEC == 0)" in code
            assert f"b_vector_ok = ({'K' if layout[1] == 't' else 'N'} % VEC == 0)" in code
        header = src.splitlines()[0]
        assert header.endswith("C = A B, row-major.") == (layout == "nn")
        assert (f"layout {layout}:" in header) == (layout != "nn")
