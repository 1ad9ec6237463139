"""Rendering: golden files of the seed kernels, what the seeds look like, every sampled config renders,
rendering is pure, and a missing template variable is an error. No GPU.

Regenerate the golden files after an intended template change with::

    AUTOTILE_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from pathlib import Path

import jinja2
import pytest

import autotile
from autotile import kernels
from autotile.device import PROFILES
from autotile.space import Problem

# `autotile.render` is the package's top-level function, which hides the submodule of the same name.
render_mod = importlib.import_module("autotile.render")

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("AUTOTILE_UPDATE_GOLDEN") == "1"

SEEDS = [("matmul", "seed-naive", "float32", "row"), ("matmul", "seed-tiled16", "float32", "row"),
         ("matmul", "seed-tiled32", "float32", "row"), ("matvec", "seed-matvec-colmajor", "float32", "col")]
# Named configs beyond the seeds, so that a template change shows in review for every kernel family: the
# tensor-core kernel, split-K (atomic and last-block), the row-major matvec, and float64 (SIMT matmul, both
# matvec layouts).
GOLDEN_CONFIGS = SEEDS + [("matmul", "tf32x3-128", "float32", "row"),
                          ("matmul", "regtile-64x128-splitk", "float32", "row"),
                          ("matvec", "warp-per-row", "float32", "row"),
                          ("matmul", "regtile-128x64", "float64", "row"),
                          ("matvec", "warp-per-row-vec2", "float64", "row"),
                          ("matvec", "col-vec2", "float64", "col"),
                          # split-K summed by the last block (SPLIT_REDUCE=last_block), each kernel family
                          ("matmul", "regtile-64-split8", "float32", "row"),
                          ("matmul", "tf32x3-64-split8", "float32", "row"),
                          ("matvec", "warp-per-row-split8", "float32", "row"),
                          ("matvec", "col-vec2-split8", "float64", "col")]


def golden_name(kernel: str, config: str, dtype: str, layout: str) -> str:
    return f"{kernel}-{config}-{dtype}-{layout}.cu"


def seed_source(kernel: str, name: str, dtype: str = "float32", layout: str = "row") -> str:
    spec = kernels.get(kernel)
    return spec.render(spec.space.named(name), dtype, layout)


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


def test_golden_comparison_reports_a_unified_diff(monkeypatch):
    # The comparison itself: a changed line fails with a diff that shows it (skipped while regenerating).
    if UPDATE:
        pytest.skip("regenerating golden files")
    text = seed_source("matmul", "seed-tiled16").replace("__syncthreads();  // the tile", "/* gone */  // the tile")
    with pytest.raises(pytest.fail.Exception) as info:
        check_golden(golden_name("matmul", "seed-tiled16", "float32", "row"), text)
    message = str(info.value)
    assert "--- golden/matmul-seed-tiled16-float32-row.cu" in message and "+++ rendered now" in message
    assert re.search(r"^-\s+__syncthreads\(\);  // the tile", message, re.M)
    assert re.search(r"^\+\s+/\* gone \*/", message, re.M)


def test_golden_files_are_the_only_ones():
    if UPDATE:
        pytest.skip("regenerating golden files")
    expected = {golden_name(*s) for s in GOLDEN_CONFIGS}
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

CASES = [(k, lay, dt) for k, layouts in (("matmul", ("row",)), ("matvec", ("row", "col")))
         for lay in layouts for dt in ("float32", "float64")]


@pytest.mark.parametrize("kernel,layout,dtype", CASES)
def test_sampled_configs_render(kernel, layout, dtype):
    spec = kernels.get(kernel)
    space = spec.space
    prob = Problem(PROFILES["h100"], dtype, layout)
    configs = space.sample(prob, 60, seed=2024)
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
        assert ("extern __shared__" in src) == (cfg["smem"] == "dynamic")
        assert ("__shared__" in src) == (cfg["smem"] != "none")
        assert ("atomicAdd" in src) == (cfg["SPLIT_K"] > 1)
        assert re.search(r"\bdouble\b", src) if dtype == "float64" else not re.search(r"\bdouble\b", src)
    assert {"static", "dynamic"} <= kinds  # (column-major configs without shared memory are rare)


def _dynamic_bytes(kernel: str, src: str, cfg, dtype_size: int) -> int:
    """The dynamic shared memory the rendered kernel indexes, read from its constants."""
    if kernel == "matmul":
        a = re.search(r"constexpr int A_STRIDE = (\d+), A_TILE = (\d+) \* A_STRIDE;", src)
        b = re.search(r"constexpr int B_STRIDE = (\d+), B_TILE = BK \* B_STRIDE;", src)
        stages = re.search(r"STAGES = (\d+);", src)
        assert a and b and stages, src
        elems = int(a.group(1)) * int(a.group(2)) + cfg["BK"] * int(b.group(1))
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
    dynamic = [c for c in space.sample(prob, 400, seed=99) if c["smem"] == "dynamic"][:40]
    assert len(dynamic) >= 10
    for cfg in dynamic:
        src = spec.render(cfg, dtype, layout)
        model = space.derive(cfg, prob)["smem_bytes"]
        assert _dynamic_bytes(kernel, src, cfg, prob.names()["dtype_size"]) == model, cfg.key()
        assert spec.launch(cfg, shape, dtype, layout).dynamic_smem_bytes == model
    for cfg in space.sample(prob, 20, seed=98):
        if cfg["smem"] != "dynamic":
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


@pytest.mark.parametrize("bk", [8, 16, 32, 64])
@pytest.mark.parametrize("bn", [32, 64, 128, 256])
def test_tf32x3_fragment_reads_are_free_of_bank_conflicts(bk, bn):
    """The strides the tensor-core template picks, replayed for one warp: A's 8-byte reads (rows
    group, k = 2 quad, 2 quad + 1) are served in two half-warp phases, B's 4-byte reads (k = 2 quad,
    column group) in one; each phase must touch 32 different banks."""
    space = kernels.get("matmul").space
    config = space.with_overrides(space.named("tf32x3-128"), {"BK": bk, "BN": bn, "WN": 32})
    a_stride, b_stride = _strides(kernels.get("matmul").render(config))
    lanes = [(lane // 4, lane % 4) for lane in range(32)]  # (group, quad)
    for half in (lanes[:16], lanes[16:]):
        banks = [(g * a_stride + 2 * q + w) % 32 for g, q in half for w in (0, 1)]
        assert len(set(banks)) == 32, (bk, a_stride, sorted(banks))
    for row in (0, 1):  # b0 and b1: rows 2 quad and 2 quad + 1
        banks = [((2 * q + row) * b_stride + g) % 32 for g, q in lanes]
        assert len(set(banks)) == 32, (bn, b_stride, sorted(banks))


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
    for cfg in spec.space.sample(prob, 30, seed=5):
        g = spec.geometry(cfg, dtype, layout)
        launch = spec.launch(cfg, (1000, 900, 800)[:len(spec.dims)], dtype, layout)
        assert launch.block == (g["block_x"], g["block_y"], 1)
        assert g["block_x"] * g["block_y"] == g["threads"] == spec.space.derive(cfg, prob)["threads"]
        assert re.search(rf"__launch_bounds__\({g['threads']}(, 1)?\)", spec.render(cfg, dtype, layout))
