"""Compile rendered kernels as the library does (`build.compile`: NVRTC with `build.COMPILE_OPTIONS`; no GPU
needed) and hold ptxas' resource report against the model. NVRTC comes with the dev extra's wheel, so these
run on any Linux machine; they skip, with the reason, only where NVRTC cannot be loaded.

For the seeds and a fixed random sample of feasible configs of each kernel, layout and dtype on the `h100`
(sm_90) and `a100` (sm_80) profiles (plus the tensor-core matmul configs, named and sampled): the kernel
compiles, ptxas' static shared memory equals the space's `smem_bytes` for smem=static and is 0 for
smem=none and smem=dynamic, and nothing spills to local memory. The matmul's transposed layouts (nt, tn,
tt) and batched kernels: the named simt configs in each, and nn's random sample spread over them, held to the
same checks; of the tf32x3 kernels (the slowest to compile) a covering set of that grid: each named config in nn
on both profiles, and every parameter value in every layout, batched and not, where the grid has it
(`_tf32x3_covering`; the dmma configs: tests/test_dmma.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import importlib
from pathlib import Path

import pytest
from covering import config_coverage, covering
from historical_space import draw, space_as_it_was

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Config, Problem, Space
from autotile.errors import CompileError

# `autotile.codegen.render` is the package's top-level function, which hides the submodule of the same name.
render_mod = importlib.import_module("autotile.codegen.render")

NVRTC_MISSING = build.nvrtc_unavailable_reason()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NVRTC_MISSING is not None,
                       reason=f"NVRTC cannot be loaded ({NVRTC_MISSING}): install autotile[dev] or a CUDA toolkit"),
]

PROFILE_NAMES = ("h100", "a100")
SEEDS = {("matmul", "nn"): ("seed-naive", "seed-tiled16", "seed-tiled32"),
         ("matvec", "col"): ("seed-matvec-colmajor",)}
RANDOM_PER_CASE = {"float32": 20, "float64": 8}
SAMPLE_SEED = 20240
TF32X3_RANDOM = 10


@dataclasses.dataclass(frozen=True)
class Case:
    profile: str
    kernel: str
    layout: str
    dtype: str
    label: str  # a seed's name, or "random<i>"
    config: Config
    batched: bool = False  # matmul: render's `batched` (the kernel "bmm")

    @property
    def arch(self) -> str:
        return PROFILES[self.profile].arch

    @property
    def id(self) -> str:
        batched = "-batched" if self.batched else ""
        return f"{self.profile}-{self.kernel}-{self.layout}-{self.dtype}-{self.label}{batched}"

    @property
    def function(self) -> str:
        return "autotile_bmm" if self.batched else f"autotile_{self.kernel}"

    def source(self) -> str:
        spec = kernels.get(self.kernel)
        if not self.batched:
            return spec.render(self.config, self.dtype, self.layout)
        return render_mod.render(spec.space.template, "bmm", self.config, self.dtype, self.layout,
                                 spec.space.source_key(self.config),
                                 spec.geometry(self.config, self.dtype, self.layout), batched=True)


# Parameters added after this sample was chosen: the random configs are drawn from the space without them
# (and take their defaults, the kernels of before), because a new parameter changes every draw of
# `Space.sample` and would replace the whole sample. Their own kernels have their own compile tests
# (SPLIT_REDUCE: tests/test_split_reduce.py).
ADDED_SINCE_THE_SAMPLE = ("SPLIT_REDUCE",)
# Choices added since, left out of the draws for the same reason (MATH=dmma: tests/test_dmma.py). MMA_K,
# which only MATH=dmma activates, then is never drawn: it stays in the space, and out of the keys below.
# MATH=wgmma was an experimental choice, never drawn, when the sample was chosen (tests/test_wgmma.py);
# PRODUCERS and LOADER, which only wgmma activates, are then constants (their defaults), as MMA_K is.
# MATH=skinny came later still, with tiles under 16 and THREADS_K and STEPS, which only it activates
# (constants here, as MMA_K is); its kernels have their own tests (tests/test_skinny.py), as MATH=mma's
# (tests/test_mma.py). VEC=8, which only the 16-bit skinny kernels take, came after all of them (in the matvec
# space, 8-wide loads came with the 16-bit types).
CHOICES_ADDED_SINCE_THE_SAMPLE = {"MATH": ("dmma", "wgmma", "skinny", "wgmma_direct", "mma"), "BM": (1, 2, 4, 8),
                                  "BN": (4, 8), "STAGES": (5, 6), "BK": (128,), "VEC": (8,)}
CONSTANTS_SINCE_THE_SAMPLE = ("MMA_K", "PRODUCERS", "LOADER", "THREADS_K", "STEPS", "CLUSTER_M",
                              "PERSISTENT", "STORE", "PINGPONG", "NARROW_COPIES", "REALIGN")
OUT_OF_THE_KEYS = (*ADDED_SINCE_THE_SAMPLE, *CONSTANTS_SINCE_THE_SAMPLE)
# Conditions as they read when the sample was drawn (skinny's exemptions added since change the
# enumeration's plan, and with it the draws).
ACTIVE_WHEN_SAMPLED = {"UNROLL": "MATH == 'simt'", "BK": "smem != 'none'", "VEC": "smem != 'none'",
                       "STAGES": "smem != 'none'", "TN": "MATH == 'simt'"}


@functools.lru_cache(maxsize=None)  # per kernel, not per profile: a space is parsed from its YAML
def _sampling_space(kernel: str) -> Space:
    if kernel != "matmul":  # matvec: 8-wide loads came with the 16-bit types (tests/test_matvec_half.py)
        return space_as_it_was(kernel, dropped=ADDED_SINCE_THE_SAMPLE,
                               added_choices=CHOICES_ADDED_SINCE_THE_SAMPLE)
    # Without dmma, MMA_K is a constant (its default) and UNROLL's condition reads as it did before: the
    # enumeration then binds and prunes in the order the sample was drawn in, and draws the same configs.
    return space_as_it_was(kernel, dropped=ADDED_SINCE_THE_SAMPLE, constants=CONSTANTS_SINCE_THE_SAMPLE,
                           added_choices=CHOICES_ADDED_SINCE_THE_SAMPLE, active=ACTIVE_WHEN_SAMPLED)


def _cases() -> list[Case]:
    out = []
    for profile in PROFILE_NAMES:
        for kernel, layouts in (("matmul", ("nn",)), ("matvec", ("row", "col"))):
            space = kernels.get(kernel).space
            sampled = _sampling_space(kernel)
            for layout in layouts:
                for dtype, n in RANDOM_PER_CASE.items():
                    for name in SEEDS.get((kernel, layout), ()):
                        out.append(Case(profile, kernel, layout, dtype, name, space.named(name)))
                    prob = Problem(PROFILES[profile], dtype, layout)
                    seed = SAMPLE_SEED + PROFILE_NAMES.index(profile)  # not the same draws on both profiles
                    for i, cfg in enumerate(draw(kernel, sampled, prob, n, seed)):
                        out.append(Case(profile, kernel, layout, dtype, f"random{i}", cfg))
        # The tensor-core path is a small part of the matmul space: its own sample, and its named configs.
        tf32 = kernels.get("matmul").space.restricted({"MATH": "tf32x3"})
        prob = Problem(PROFILES[profile], "float32", "nn")
        for name, cfg in tf32.named_configs.items():
            out.append(Case(profile, "matmul", "nn", "float32", name, cfg))
        tf32_sampled = _sampling_space("matmul").restricted({"MATH": "tf32x3"})
        for i, cfg in enumerate(draw("matmul", tf32_sampled, prob, TF32X3_RANDOM, SAMPLE_SEED + 7)):
            out.append(Case(profile, "matmul", "nn", "float32", f"tf32x3-random{i}", cfg))
    return out


MATMUL_LAYOUTS = ("nn", "nt", "tn", "tt")
TRANSPOSED = MATMUL_LAYOUTS[1:]


def _layout_cases(nn_cases: list[Case]) -> list[Case]:
    """The transposed layouts and batched kernels, without new draws (the sampler is slow): each named simt
    and tf32x3 config in nt, tn and tt on one profile and batched (in one layout, nn included) on the
    other, and every third config of nn's random matmul sample in one transposed layout, some batched."""
    out = []
    space = kernels.get("matmul").space
    named = [(name, cfg) for name, cfg in space.named_configs.items()
        if cfg["MATH"] not in ("dmma", "wgmma", "wgmma_direct", "mma")]
    for i, (name, cfg) in enumerate(named):
        out += [Case(PROFILE_NAMES[i % 2], "matmul", layout, "float32", name, cfg) for layout in TRANSPOSED]
        out.append(Case(PROFILE_NAMES[(i + 1) % 2], "matmul", MATMUL_LAYOUTS[i % 4], "float32", name, cfg, True))
    randoms = [c for c in nn_cases if c.kernel == "matmul" and "random" in c.label]
    for i, case in enumerate(randoms[::3]):
        out.append(dataclasses.replace(case, layout=TRANSPOSED[i % 3], batched=i % 4 == 0))
    return out


def _tf32x3_coverage(case: Case) -> set[tuple]:
    """What a tf32x3 case covers (`covering.config_coverage`): each value of each parameter of its config,
    alone and on its profile, in its layout and batched or not; its (profile, layout, batched); and, for a
    named config in a transposed layout or batched, that name there."""
    out = config_coverage(case.config, profile=case.profile, layout=case.layout, batched=case.batched)
    if "random" not in case.label and (case.layout != "nn" or case.batched):
        out.add(("named elsewhere", case.label))
    return out


def _tf32x3_covering(cases: list[Case]) -> list[Case]:
    """`cases` with their tf32x3 kernels cut to a covering set (tests/covering.py). A tf32x3 kernel takes one
    to five seconds to compile (ptxas schedules its three products), the others a fraction: the 87 of the
    whole grid were 135 of the file's 201 CPU seconds of NVRTC 12.9 (2026-12-07). Every named tf32x3 config
    stays in nn on both profiles (the sm_90 and sm_80 kernels the library builds); of the rest (the named
    configs in nt, tn, tt and batched, and the random sample in nn and in those) the greedy, deterministic
    choice keeps what covers everything the whole grid did: every value of every parameter on each profile,
    in each layout, batched and not, where the grid had it; each (profile, layout, batched) it had; each
    named config outside nn. On this sample: 50 of the 87 kernels, 81 of their 135 CPU seconds. Every other
    kernel is kept."""
    tf32 = [c for c in cases if c.config.get("MATH") == "tf32x3"]
    kept = covering(tf32, lambda c: "random" not in c.label and c.layout == "nn" and not c.batched,
                    _tf32x3_coverage)
    chosen = {c.id for c in kept}
    return [c for c in cases if c.config.get("MATH") != "tf32x3" or c.id in chosen]


CASES = _cases()
CASES += _layout_cases(CASES)
CASES = _tf32x3_covering(CASES)


def _compile(case: Case) -> build.CompileResult:
    """The library's own compile (`build.compile`, default options) for the profile's architecture."""
    source = case.source()
    try:
        return build.compile(source, case.arch)
    except CompileError as exc:
        raise AssertionError(f"{case.id} {case.config.key()}: {exc}\n{exc.log[-3000:]}") from None


@pytest.fixture(scope="module")
def reports() -> dict[str, build.CompileResult | BaseException]:
    out: dict[str, build.CompileResult | BaseException] = {}
    # NVRTC compiles independent programs in parallel, without the GIL.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {pool.submit(_compile, case): case for case in CASES}
        for future in concurrent.futures.as_completed(futures):
            case = futures[future]
            try:
                out[case.id] = future.result()
            except BaseException as exc:  # reported by the test of that case
                out[case.id] = exc
    return out


def _result(reports, case: Case) -> build.CompileResult:
    result = reports[case.id]
    if isinstance(result, BaseException):
        raise result
    return result


def _usage(reports, case: Case) -> build.ResourceUsage:
    result = _result(reports, case)
    assert len(result.usages) == 1, result.log
    return result.usages[0]


def test_sample_covers_the_space():
    assert len({c.id for c in CASES}) == len(CASES)
    for profile in PROFILE_NAMES:
        for kernel in ("matmul", "matvec"):
            kinds = {c.config["smem"] for c in CASES if (c.profile, c.kernel) == (profile, kernel)}
            assert {"static", "dynamic"} <= kinds, (profile, kernel, kinds)
    for case in CASES:
        assert kernels.get(case.kernel).space.is_feasible(case.config, Problem(PROFILES[case.profile], case.dtype,
                                                                                 case.layout))


def test_compiles_with_the_librarys_options(reports):
    """The figures below come from the compiler and options the library uses: build's COMPILE_OPTIONS, the
    profile's arch as a cubin target, and the request for ptxas' report; nothing else."""
    for case in CASES[:: max(1, len(CASES) // 20)]:
        result = _result(reports, case)
        assert result.options == (*build.COMPILE_OPTIONS, f"-arch={case.arch}", "-Xptxas=-v")
        assert result.options == build.nvrtc_options(case.arch)
        assert result.kind == "cubin" and result.compiler == build.compiler_version()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_compiles_for_the_profile_arch(reports, case):
    usage = _usage(reports, case)
    assert usage.function == case.function
    assert usage.arch == case.arch
    assert 0 < usage.registers <= 255


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_static_smem_matches_the_model(reports, case):
    usage = _usage(reports, case)
    space = kernels.get(case.kernel).space
    model = space.derive(case.config, Problem(PROFILES[case.profile], case.dtype, case.layout))["smem_bytes"]
    if case.config["smem"] == "static":
        assert usage.static_smem == model, f"{case.config.key()}: ptxas {usage.static_smem} bytes smem, model {model}"
    else:
        assert usage.static_smem == 0, (f"{case.config.key()}: smem={case.config['smem']} but ptxas reports "
                                        f"{usage.static_smem}")
        if case.config["smem"] == "none":
            assert model == 0


# Configs known to spill, as (profile, dtype, config key) -> (reason, the compilers they were seen to spill
# with, as prefixes of build.compiler_version()). Under those compilers each is a strict xfail; under
# another, a plain xfail: ptxas' register allocation moves between releases (NVRTC 13.5 spills neither,
# NVRTC 12.9, the dev extra's, spills both), and a compiler not yet seen may go either way.
KNOWN_SPILLS: dict[tuple[str, str, str], tuple[str, tuple[str, ...]]] = {
    ("h100", "float64", "smem=dynamic,ROWS=32,THREADS_K=64,VEC=2,X_SHARED=False,STAGE_A=True,TILE_K=16,"
                        "SPLIT_K=2,UNROLL=2,BATCH=False"):
        ("ptxas keeps 8 bytes of the float64 staged-A matvec on the stack although it uses only 32 registers "
         "(nvcc 13 did too); a seed-004-style kernel that no tuned config uses", ("nvrtc-12.9",)),
    ("h100", "float32", "smem=dynamic,ROWS=4,THREADS_K=64,VEC=4,X_SHARED=False,STAGE_A=True,TILE_K=128,"
                        "SPLIT_K=32,UNROLL=8,BATCH=False"):
        ("ptxas keeps 4 bytes of the float32 staged-A matvec on the stack at 32 registers (NVRTC 13.5 uses 40 "
         "and spills nothing); no tuned config uses it", ("nvrtc-12.9",)),
    **{(profile, "float32", "MATH=tf32x3,smem=dynamic,BM=32,BN=128,WM=32,WN=32,TM=1,TN=1,BK=32,VEC=4,"
                            "A_TRANSPOSED=False,PAD=0,STAGES=3,SPLIT_K=1,SWIZZLE=8,UNROLL=full"):
       ("NVRTC 12.9's ptxas holds the 128-thread tf32x3 kernel with its exact path at 168 registers (three "
        "blocks per SM) and spills 4-12 bytes; asking for one block per SM removes the spill but cost small "
        "K shapes 8-11% on an H100 (fewer blocks per SM), so the spill stays", ("nvrtc-12.9",))
       for profile in ("h100", "a100")},
}


def _key(case: Case) -> str:
    """`Config.key()` without the parameters added since the sample was chosen, as in KNOWN_SPILLS."""
    # matvec has a THREADS_K of its own (and none of matmul's constants): only the parameters added since
    left_out = OUT_OF_THE_KEYS if case.kernel == "matmul" else ADDED_SINCE_THE_SAMPLE
    return ",".join(f"{k}={v}" for k, v in case.config.items() if k not in left_out)


def _new_layout(case: Case) -> bool:
    """A matmul case in a transposed layout or batched (the sample of before: nn, unbatched)."""
    return case.kernel == "matmul" and (case.layout != "nn" or case.batched)


# The transposed layouts and batched kernels: at a register count a little over an occupancy step, ptxas
# may spill a few bytes to stay on the step (NVRTC 12.9: safe-default tn at 64 registers, 4 bytes;
# safe-default batched at 80, 12 bytes; tf32x3-32x128 nt at 168, 4 bytes stored and 12 loaded, as it does
# in nn, see KNOWN_SPILLS). More than this would be a spill in earnest.
NEW_LAYOUT_SPILL_BYTES = 16


def _spill_param(case: Case):
    known = None if _new_layout(case) else KNOWN_SPILLS.get((case.profile, case.dtype, _key(case)))
    marks = []
    if known:
        reason, compilers = known
        strict = build.compiler_version().startswith(compilers)
        marks.append(pytest.mark.xfail(reason=reason, strict=strict))
    return pytest.param(case, marks=marks, id=case.id)


def test_known_spills_are_in_the_sample():
    # Keeps KNOWN_SPILLS honest: an entry that the sample no longer draws is stale.
    drawn = {(c.profile, c.dtype, _key(c)) for c in CASES}
    assert set(KNOWN_SPILLS) <= drawn


@pytest.mark.parametrize("case", [_spill_param(c) for c in CASES])
def test_no_spills(reports, case):
    usage = _usage(reports, case)
    allowed = NEW_LAYOUT_SPILL_BYTES if _new_layout(case) else 0
    assert max(usage.spill_stores, usage.spill_loads) <= allowed, (
        f"{case.config.key()}: {usage.spill_stores} bytes spill stores, {usage.spill_loads} bytes spill loads, "
        f"{usage.registers} registers, {usage.stack_frame} bytes stack frame")


# How far ptxas' register count may exceed the tf32x3 model, per compiler major version. Fitted with CUDA 13
# (56; NVRTC 13.5 reaches it on this sample); NVRTC 12.9 schedules some tiles with more registers (up to 62
# above the model on this sample: a100, BM=64 BN=16 WM=32 WN=16 STAGES=3).
TF32X3_REGISTER_MARGIN = {"nvrtc-12": 64, "nvrtc-13": 56}


@pytest.mark.parametrize("case", [c for c in CASES if c.config.get("MATH") == "tf32x3"], ids=lambda c: c.id)
def test_tf32x3_register_model_is_close(reports, case):
    """The occupancy model (blocks per SM by registers) rests on the register estimate. For the
    tensor-core kernels ptxas' count moves with its scheduling (fitted on 73 configs, it undercounts by
    up to about 50); this catches a model that drifts further, such as one that forgets the second set
    of accumulators (64 or more registers on the common warp tiles)."""
    usage = _usage(reports, case)
    model = kernels.get("matmul").space.derive(case.config, Problem(PROFILES[case.profile]))["regs_per_thread"]
    margin = TF32X3_REGISTER_MARGIN.get(kernels.compiler_major(build.compiler_version()), 56)
    assert usage.registers <= model + margin, f"{case.config.key()}: ptxas {usage.registers}, model {model}"


def test_timing_harness_kernels_compile():
    """The flush (read_all) and hold kernels the timing loop launches build for sm_90 without spills."""
    from autotile.runtime.timing import HARNESS_SOURCE

    result = build.compile(HARNESS_SOURCE, "sm_90")
    assert {u.function for u in result.usages} == {"read_all", "hold"}
    assert all(u.stack_frame == 0 and u.spill_stores == 0 for u in result.usages), result.log


# The shipped tf32x3 configs the tuner measured fastest may run right at the 255-register ceiling, and some
# spill a few bytes: with CUDA 13, two (H200 4096x4096x64: 8 bytes under nvcc 13, 4 under NVRTC 13.5;
# 8192x8192x128: 20; both 1.4x cuBLAS when timed); with NVRTC 12.9, five H200 configs spill 8 or 16 bytes.
# Since the numerics issue (FP32 semantics: scaled split, exact path for non-finite tiles) NVRTC 12.9
# spills up to 36 bytes on one of them (H100 8192^3, outside the inner loop: one reload per tile).
# More than this would mean a template change made a shipped kernel spill in earnest.
# dmma: the shipped float64 configs (tuned 2026-11-22 with NVRTC 13.0) run at the 255-register cap; NVRTC
# 13.0 spills up to 44 bytes on the fastest at 4096^3, NVRTC 12.9 more (see test_dmma.DMMA_SPILL_BYTES).
# wgmma (sm_90a): the producer's addresses are recomputed in each pass, so nothing spills.
SHIPPED_SPILL_BYTES = {"simt": 0, "tf32x3": 40, "dmma": 640, "wgmma": 0}


def _shipped_matmul() -> list[tuple[str, Config, str, str]]:
    import json

    cases = []
    for path in sorted((Path(__file__).parent.parent / "cache").glob("*/matmul-*.json")):
        record = json.loads(path.read_text())
        config = kernels.get("matmul").space.config(record["config"])
        cases.append((f"{path.parent.name}/{path.stem}", config, record["dtype"], record["layout"]))
    return cases


def test_shipped_matmul_configs_compile_without_real_spills():
    """Every matmul config shipped in cache/ compiles for sm_90; registers and spills within bounds."""
    shipped = _shipped_matmul()
    assert len(shipped) >= 20
    # Records of several GPUs (an H100's and an H200's) often hold the same kernel: each source is compiled
    # once (two threads given the same source at once would both compile it before the memo has it).
    sources = {name: kernels.get("matmul").render(config, dtype, layout) for name, config, dtype, layout in shipped}

    def compile_one(source):
        try:
            return build.compile(source, build.target_arch(90, build.needs_arch_specific(source)))
        except CompileError as exc:
            names = [name for name, s in sources.items() if s == source]
            raise AssertionError(f"{', '.join(names)}: {exc}\n{exc.log[-2000:]}") from None

    distinct = list(dict.fromkeys(sources.values()))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = dict(zip(distinct, pool.map(compile_one, distinct), strict=True))
    for name, config, _, _ in shipped:
        # the product (a wgmma LOADER=presplit source holds its two split kernels too, which spill nothing)
        usages = results[sources[name]].usages
        (usage,) = [u for u in usages if u.function == "autotile_matmul"]
        assert all(u.spill_stores == 0 for u in usages if u is not usage), (name, usages)
        allowed = SHIPPED_SPILL_BYTES[config["MATH"]]
        assert usage.spill_stores <= allowed, f"{name} ({config.key()}): {usage.spill_stores} bytes spilled"
