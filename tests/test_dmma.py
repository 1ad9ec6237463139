"""The FP64 tensor-core matmul (MATH=dmma), without a GPU: the fragment reads replayed for bank conflicts
(nn; every layout: tests/test_render.py), the rendered mma for each MMA_K, the library's own compile (NVRTC)
of its named configs and a sample for sm_80 and sm_90 against the space's register model, in every layout
(nn, nt, tn, tt) and batched, and the machine code (SASS) holding DMMA instructions and no FP64 FMA. The
SASS needs ptxas (a CUDA toolkit) and nvdisasm (the dev extra's nvidia-cuda-nvdisasm wheel, or a toolkit);
those tests skip, with the reason, where either is missing."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import re

import pytest
from historical_space import sample_before_skinny
from sass_support import needs_sass
from sass_support import sass as sass_of

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Config, Problem
from autotile.errors import CompileError

# `autotile.codegen.render` is the package's top-level function, which hides the submodule of the same name.
render_mod = importlib.import_module("autotile.codegen.render")

SPEC = kernels.get("matmul")
DMMA = SPEC.space.restricted({"MATH": "dmma"})
PROFILE_NAMES = ("h100", "a100")
RANDOM = 8
SAMPLE_SEED = 20261122

NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")


def _strides(src: str) -> tuple[int, int]:
    a = re.search(r"constexpr int A_STRIDE = (\d+), A_TILE", src)
    b = re.search(r"constexpr int B_STRIDE = (\d+), B_TILE", src)
    assert a and b, src
    return int(a.group(1)), int(b.group(1))


def _code(src: str) -> str:
    """The source without its // comments: what the compiler sees of it."""
    return "\n".join(line.split("//", 1)[0] for line in src.splitlines())


@pytest.mark.parametrize("bk", [8, 16, 32, 64])
@pytest.mark.parametrize("bn", [16, 32, 64, 128, 256])
def test_fragment_reads_are_free_of_bank_conflicts(bk, bn):
    """The strides the template picks, replayed for one warp: every fragment read is 8 bytes (two 4-byte
    banks), served in two half-warp phases; each phase must touch 32 different banks. A: rows group (and
    group + 8), k = quad; B: row quad, column group."""
    config = SPEC.space.with_overrides(DMMA.named("dmma-64"), {"BK": bk, "BN": bn, "WN": 16})
    a_stride, b_stride = _strides(SPEC.render(config, "float64"))
    lanes = [(lane // 4, lane % 4) for lane in range(32)]  # (group, quad)
    for half in (lanes[:16], lanes[16:]):
        for row_offset in (0, 8):
            banks = [(2 * ((g + row_offset) * a_stride + q) + w) % 32 for g, q in half for w in (0, 1)]
            assert len(set(banks)) == 32, (bk, a_stride, sorted(banks))
        banks = [(2 * (q * b_stride + g) + w) % 32 for g, q in half for w in (0, 1)]
        assert len(set(banks)) == 32, (bn, b_stride, sorted(banks))


@pytest.mark.parametrize("mma_k", [4, 8, 16])
def test_renders_the_f64_mma_of_its_depth_and_the_sm80_pairs(mma_k):
    config = SPEC.space.with_overrides(DMMA.named("dmma-128"), {"MMA_K": mma_k})
    code = _code(SPEC.render(config, "float64"))
    assert f"mma.sync.aligned.m16n8k{mma_k}.row.col.f64.f64.f64.f64" in code  # sm_90: one instruction
    assert "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64" in code  # sm_80: m8n8k4 pairs
    assert "constexpr int KM = %d" % mma_k in code and "using T = double;" in code
    assert "cp.async.cg.shared.global" in code  # VEC=2: 16-byte copies of the shared pipeline
    assert "fabsf" not in code and "SCALE" not in code  # nothing of tf32x3's split


def test_space_keeps_dmma_to_float64_on_sm80_and_newer():
    config = DMMA.named("dmma-128")
    assert SPEC.space.is_feasible(config, Problem(PROFILES["h100"], "float64"))
    assert SPEC.space.is_feasible(config, Problem(PROFILES["a100"], "float64"))
    assert not SPEC.space.is_feasible(config, Problem(PROFILES["h100"], "float32"))
    tf32 = SPEC.space.named("tf32x3-128")
    assert not SPEC.space.is_feasible(tf32, Problem(PROFILES["h100"], "float64"))
    # MMA_K must divide the K step
    deep = SPEC.space.with_overrides(config, {"MMA_K": 16, "BK": 8})
    violations = SPEC.space.violations(deep, Problem(PROFILES["h100"], "float64"))
    assert any("dmma steps divide the K step" in v for v in violations)


LAYOUTS = ("nn", "nt", "tn", "tt")


def render(cfg: Config, layout: str = "nn", batched: bool = False) -> str:
    """The float64 kernel of `cfg`; batched as the caller renders it (kernel "bmm")."""
    if not batched:
        return SPEC.render(cfg, "float64", layout)
    return render_mod.render(SPEC.space.template, "bmm", cfg, "float64", layout, SPEC.space.source_key(cfg),
                             SPEC.geometry(cfg, "float64", layout), batched=True)


@functools.lru_cache(maxsize=None)
def _sample(profile: str) -> tuple[Config, ...]:
    """The random configs of a profile: drawn on first use, not at collection (seconds of rejection draws,
    which every pytest-xdist worker would pay though one runs these tests)."""
    p = PROFILE_NAMES.index(profile)
    problem = Problem(PROFILES[profile], "float64", "nn")
    sample = tuple(sample_before_skinny({"MATH": "dmma"}, problem, RANDOM, seed=SAMPLE_SEED + p))
    assert len(sample) == RANDOM, (profile, len(sample))
    return sample


def config(case) -> Config:
    """The config a case names: a named config, or "random<i>", the i-th of its profile's sample."""
    profile, label, _, _ = case
    if label.startswith("random"):
        return _sample(profile)[int(label.removeprefix("random"))]
    return DMMA.named(label)


def _cases() -> list[tuple[str, str, str, bool]]:
    """(profile, label, layout, batched): the named configs and a sample in nn on both profiles; each named
    config also in nt, tn and tt on one profile and batched (a layout each) on the other; the sample, each
    config once more in a transposed layout (every other one batched)."""
    out = []
    for profile in PROFILE_NAMES:
        out += [(profile, name, "nn", False) for name in DMMA.named_configs]
        out += [(profile, f"random{i}", "nn", False) for i in range(RANDOM)]
        out += [(profile, f"random{i}", LAYOUTS[1 + i % 3], i % 2 == 1) for i in range(RANDOM)]
    for i, name in enumerate(DMMA.named_configs):
        out += [(PROFILE_NAMES[i % 2], name, layout, False) for layout in LAYOUTS[1:]]
        out.append((PROFILE_NAMES[(i + 1) % 2], name, LAYOUTS[i % 4], True))
    return out


CASES = _cases()


def _id(case) -> str:
    profile, label, layout, batched = case
    return f"{profile}-{layout}-{label}{'-batched' if batched else ''}"


@pytest.fixture(scope="module")
def compiled() -> dict[str, build.CompileResult | BaseException]:
    def source(case) -> str:
        _, _, layout, batched = case
        return render(config(case), layout, batched)

    out: dict[str, build.CompileResult | BaseException] = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {pool.submit(build.compile, source(case), PROFILES[case[0]].arch): case for case in CASES}
        for future in concurrent.futures.as_completed(futures):
            try:
                out[_id(futures[future])] = future.result()
            except (CompileError, AssertionError) as exc:
                out[_id(futures[future])] = exc
    return out


# How far ptxas' register count may exceed the dmma model (NVRTC 12.9 on this sample: up to 91 above it;
# ptxas schedules the fragment reads of later steps early, as registers allow, up to the 255 cap).
DMMA_REGISTER_MARGIN = 100
# The fastest dmma configs run at the 255-register cap and some spill a little (NVRTC 13.0 on an H100:
# up to 44 bytes among the best 15 at 4096^3); more than this would be a template change that spills in
# earnest.
DMMA_SPILL_BYTES = 640


@pytest.mark.slow
@needs_nvrtc
def test_cases_are_distinct_and_feasible():
    assert len({_id(c) for c in CASES}) == len(CASES)
    for case in CASES:
        profile, _, layout, _ = case
        cfg = config(case)
        assert SPEC.space.is_feasible(cfg, Problem(PROFILES[profile], "float64", layout)), (profile, layout, cfg.key())


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_compiles_within_the_register_model(compiled, case):
    profile, _, layout, batched = case
    cfg = config(case)
    result = compiled[_id(case)]
    if isinstance(result, BaseException):
        raise result
    (usage,) = result.usages
    assert usage.function == ("autotile_bmm" if batched else "autotile_matmul")
    derived = SPEC.space.derive(cfg, Problem(PROFILES[profile], "float64", layout))
    model = derived["regs_per_thread"]
    assert usage.static_smem == (derived["smem_bytes"] if cfg["smem"] == "static" else 0)
    assert usage.registers <= model + DMMA_REGISTER_MARGIN, f"{cfg.key()}: ptxas {usage.registers}, model {model}"
    assert usage.spill_stores <= DMMA_SPILL_BYTES, f"{cfg.key()}: {usage.spill_stores} bytes spilled"


@pytest.mark.slow
@needs_nvrtc
@needs_sass
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("mma_k,layout,batched", [(4, "nn", False), (8, "nn", False), (16, "nn", False),
                                                  (8, "tn", False), (16, "nt", True), (4, "tt", True)])
def test_sass_multiplies_on_the_fp64_tensor_cores(arch, mma_k, layout, batched):
    """The products are DMMA instructions (the FP64 tensor cores), with no FP64 FMA (DFMA) anywhere: sm_90
    runs one DMMA of the configured depth per mma, sm_80 DMMA.884s; in every layout, batched or not."""
    config = SPEC.space.with_overrides(DMMA.named("dmma-64"), {"MMA_K": mma_k})
    sass = sass_of(render(config, layout, batched), arch)
    dmma = re.findall(r"\bDMMA\.(\S+)", sass)
    assert dmma, sass[-2000:]
    assert "DFMA" not in sass
    shapes = set(dmma)
    if arch == "sm_90":
        assert shapes == {f"16x8x{mma_k}"}, shapes
    else:
        assert shapes == {"884"}, shapes
