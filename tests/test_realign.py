"""REALIGN on the mma.sync kernels of the 16-bit types and int8: where an operand's rows do not start aligned to
VEC elements, each copy of VEC elements inside the matrix reads the two aligned pieces that hold it and shifts
them into place in registers (instead of single 16- or 8-bit elements through registers), its stores deferred
past the products of the tile before it. Without a GPU: the source it adds, that nothing else changes, the
constraint, that it compiles without spills in every layout; with one (`gpu`): results against float64 on rows
of every misalignment, operands that start off their allocation's alignment, batched and split."""

from __future__ import annotations

import pytest

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem
from autotile.errors import AutotileError

SPACE = kernels.get("matmul").space
# mma: small and large tiles, K split by the last block, int8's own tiles (4-byte copies: VEC 4 of one byte)
NAMES = {"bfloat16": ("mma-32", "mma-64-split4", "mma-128"), "float16": ("mma-64", "mma-32"),
         "int8": ("mma8-32", "mma8-64-split4")}
# wgmma_direct (sm_90a): its producer's register copies, where the TMA cannot copy an operand
DIRECT = {"bfloat16": ("direct-64", "direct-128x256"), "float16": ("direct-128",), "int8": ("direct8-64-split8",)}
# skinny (16-bit): both K loops (B transposed and row-major), K split, vectors of 2, 4 and 8 elements
SKINNY = {"bfloat16": ("skinny-t-4", "skinny-n-4", "skinny-t-16-split4"), "float16": ("skinny-t-1", "skinny-n-16")}
LAYOUTS = ("nn", "nt", "tn", "tt")


def _realigned(name: str, kernel: str = "matmul", **overrides):
    space = kernels.get(kernel).space
    return space.with_overrides(space.named(name), {"REALIGN": True, **overrides})


@pytest.mark.parametrize("dtype", sorted(NAMES))
def test_realign_adds_one_path_and_changes_nothing_else(dtype):
    """The realigned configs render the plain source plus the helpers, one deferred path per operand and the
    placing of their pieces; the plain configs do not mention it (their source, and so the shipped
    databases' columns, stay as timed)."""
    spec = kernels.get("matmul")
    for name in NAMES[dtype]:
        plain = spec.render(spec.space.named(name), dtype, "nt")
        realigned = spec.render(_realigned(name), dtype, "nt")
        assert "pieces" not in plain and "_held" not in plain
        width = SPACE.named(name)["VEC"] * {"int8": 1}.get(dtype, 2)  # bytes per copy
        assert realigned.count(f"load_pieces<VEC * {width // SPACE.named(name)['VEC']}>(") == 2  # A's and B's
        assert realigned.count(f"place_pieces<{width}>(") == 2
        assert "auto place_tiles" in realigned and realigned.count("place_tiles(") == 2  # first tiles, K loop
        # every line of the plain source but the config's own comment and the single-element copies it replaces
        plain_lines = {line for line in plain.splitlines() if not line.startswith("// config:")}
        kept = plain_lines - set(realigned.splitlines())
        assert all("copy_async<" in line or "const T* src" in line or "T* dst" in line or "Rows that" in line
                   or "neighbouring threads" in line or "const int dr" in line or "for (int l" in line
                   for line in kept), kept


def test_realign_needs_copies_of_four_bytes_or_more():
    problem = Problem(PROFILES["h100"], "bfloat16", "nt")
    assert SPACE.is_feasible(_realigned("mma-32"), problem)
    narrow = _realigned("mma-32", VEC=1)
    assert not SPACE.is_feasible(narrow, problem)
    assert any("realigned copies" in str(v) for v in SPACE.violations(narrow, problem))
    int8 = Problem(PROFILES["h100"], "int8", "nt")
    assert SPACE.is_feasible(_realigned("mma8-32"), int8)
    assert not SPACE.is_feasible(_realigned("mma8-32", VEC=2), int8)  # 2-byte copies
    # skinny: the 16-bit types' packed vectors only
    assert SPACE.is_feasible(_realigned("skinny-t-4"), problem)
    assert not SPACE.is_feasible(_realigned("skinny-t-4"), Problem(PROFILES["h100"], "float32", "nt"))
    # the other kernels have no such path: the parameter is not theirs
    with pytest.raises(AutotileError, match="REALIGN only where MATH in"):
        SPACE.check(SPACE.with_overrides(SPACE.named("tf32x3-64"), {"REALIGN": True}),
                    Problem(PROFILES["h100"], "float32", "nt"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_realign_compiles_without_spills(layout):
    """Every layout (the pieces follow each operand's contiguous dimension), batched too, for sm_90 and sm_80;
    one tile per dtype and layout (a compile is about a second: the suite stays fast)."""
    i = LAYOUTS.index(layout)
    for dtype, names in NAMES.items():
        name = names[i % len(names)]
        kernel = ("matmul", "bmm")[i % 2]
        spec = kernels.get(kernel)
        config = _realigned(name, kernel)
        assert spec.space.is_feasible(config, Problem(PROFILES["a100"], dtype, layout)), (name, dtype, layout)
        arch = ("sm_90", "sm_80")[(i // 2) % 2]
        usage = build.compile(spec.render(config, dtype, layout), arch).usage(f"autotile_{kernel}")
        model = spec.space.derive(config, Problem(PROFILES["h100"], dtype, layout))["regs_per_thread"]
        assert usage is not None and usage.spill_stores == 0 and usage.stack_frame == 0, (name, dtype, usage)
        assert usage.registers <= model + 56, (name, dtype, layout, usage.registers, model)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_realigned_wgmma_direct_compiles_without_spills(layout):
    """wgmma_direct's realigned register copies, sm_90a, every layout, each dtype in two of them (a compile of
    this kernel is a second or two of CI's cores)."""
    i = LAYOUTS.index(layout)
    # int8 in tn takes the producer's transposing copies for both operands (wgmma reads 8-bit tiles K-major)
    where = {"bfloat16": ("nn", "tn"), "float16": ("nt", "tt"), "int8": ("nt", "tt")}
    for dtype, names in DIRECT.items():
        if layout not in where[dtype]:
            continue
        name = names[i % len(names)]
        spec = kernels.get(("matmul", "bmm")[i % 2])
        config = _realigned(name, spec.name)
        assert spec.space.is_feasible(config, Problem(PROFILES["h100"], dtype, layout)), (name, dtype, layout)
        source = spec.render(config, dtype, layout)
        assert "shift_pieces<16>(src, pieces, w);" in source
        usage = build.compile(source, "sm_90a").usage(f"autotile_{spec.name}")
        assert usage is not None and usage.spill_stores == 0 and usage.stack_frame == 0, (name, dtype, layout, usage)


@pytest.mark.parametrize("vec", [4, 8])
def test_realigned_skinny_kernels_compile_without_spills(vec):
    """The skinny kernels' realigned K loops (B transposed: nt, tt; row-major: nn), vectors of 8 and 16 bytes
    (4-byte ones: the GPU test), sm_90."""
    spec = kernels.get("matmul")
    for layout, name in (("nt", "skinny-t-4"), ("tt", "skinny-t-16-split4"), ("nn", "skinny-n-4")):
        config = _realigned(name, VEC=vec)
        problem = Problem(PROFILES["h100"], "bfloat16", layout)
        if not SPACE.is_feasible(config, problem):  # 8-wide vectors of a row-major tile too wide for its block
            continue
        source = spec.render(config, "bfloat16", layout)
        assert "load_realigned(" in source and "realigned_words(" in source and f"load_pieces<{2 * vec}>(" in source
        usage = build.compile(source, "sm_90").usage("autotile_matmul")
        assert usage is not None and usage.spill_stores == 0 and usage.stack_frame == 0, (name, vec, layout, usage)
        assert usage.registers <= SPACE.derive(config, problem)["regs_per_thread"] + 56, (name, vec, layout)


# The helpers compiled for the host: CUDA's vector types and `__funnelshift_r` (the shift taken modulo 32, as the
# CUDA math API defines it) written out; the vectors placed against pages that fault.
_HOST_SHIMS = """
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#define __device__
#define __forceinline__ inline
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
static uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return static_cast<unsigned>(((static_cast<unsigned long long>(hi) << 32) | lo) >> (shift & 31u));
}
using T = unsigned char;  // one byte: every start a vector of any element type can have
"""

_HOST_MAIN = """
template <int BYTES>
static int compare(const unsigned char* src, int wanted, int offset, const char* where) {
    unsigned pieces[BYTES / 2];
    unsigned out[BYTES / 4];
    unsigned char expected[BYTES] = {};
    if (wanted == BYTES) {
        load_pieces<BYTES>(src, pieces);
        shift_pieces<BYTES>(src, pieces, out);
    } else {
        load_pieces<BYTES>(src, pieces, wanted);
        shift_pieces<BYTES>(src, pieces, out, wanted);
    }
    std::memcpy(expected, src, wanted);
    if (std::memcmp(out, expected, BYTES) == 0) return 0;
    std::printf("BYTES %d offset %d wanted %d (%s): wrong bytes\\n", BYTES, offset, wanted, where);
    return 1;
}

template <int BYTES>
static int check(const unsigned char* page, size_t size) {
    int failures = 0;
    // Whole vectors ending at the last byte before a faulting page and starting at the first byte after one, at
    // every misalignment: a piece read outside the vector's aligned granules would fault.
    for (int d = 0; d < BYTES; ++d) {
        failures += compare<BYTES>(page + size - BYTES - d, BYTES, d, "before a faulting page");
        failures += compare<BYTES>(page + d, BYTES, d, "after a faulting page");
    }
    // A row's last vector: its first `wanted` bytes kept, the rest zeros and, where they lie in a faulting page,
    // not read (wanted 0: nothing read); and every misalignment of every length, inside the page.
    for (int wanted = 0; wanted < BYTES; ++wanted) {
        failures += compare<BYTES>(page + size - wanted, wanted, static_cast<int>((size - wanted) % BYTES),
                                   "ending at a faulting page");
        for (int d = 0; d < BYTES; ++d) failures += compare<BYTES>(page + 64 + d, wanted, d, "inside the page");
    }
    return failures;
}

int main() {
    const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto* map = static_cast<unsigned char*>(
        mmap(nullptr, 3 * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (map == MAP_FAILED) return 2;
    unsigned char* page = map + size;
    for (size_t i = 0; i < size; ++i) page[i] = static_cast<unsigned char>(i * 37u + 11u + i / 251u);
    if (mprotect(map, size, PROT_NONE) != 0 || mprotect(page + size, size, PROT_NONE) != 0) return 2;
    const int failures = check<4>(page, size) + check<8>(page, size) + check<16>(page, size);
    std::printf("%d failures\\n", failures);
    return failures ? 1 : 0;
}
"""


def test_realign_helpers_move_every_misaligned_vector_on_the_host(tmp_path):
    """load_pieces and shift_pieces as rendered, compiled for the host (no GPU needed): 4-, 8- and 16-byte vectors
    at every byte offset give their own bytes back, and never read a byte outside the aligned granules that hold
    the vector (vectors against pages that fault); so do a row's last vectors of every shorter length (the bytes
    past it zeros, and not read where they fault)."""
    import shutil
    import subprocess

    from autotile.codegen import render

    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("needs a host C++ compiler (g++)")
    helpers = render.environment().get_template("realign.cuh.j2").render()
    source = tmp_path / "realign_host.cpp"
    source.write_text(_HOST_SHIMS + helpers + _HOST_MAIN)
    binary = tmp_path / "realign_host"
    subprocess.run([compiler, "-std=c++17", "-O2", "-fno-strict-aliasing", "-Wno-unknown-pragmas", str(source),
                    "-o", str(binary)], check=True, capture_output=True, text=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "0 failures", (result.returncode, result.stdout)


def _offset_view(x, xp, elements: int):
    """`x` with the same values and strides, its storage starting `elements` past an aligned allocation."""
    stored = x if x.flags.c_contiguous else x.swapaxes(-1, -2)  # the contiguous layout it is a view of
    buffer = xp.empty(stored.size + elements, dtype=stored.dtype)
    moved = buffer[elements:].reshape(stored.shape)
    moved[...] = stored
    return moved if x.flags.c_contiguous else moved.swapaxes(-1, -2)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", sorted(NAMES))
def test_realign_matches_reference(dtype, layout):
    """Rows of every length mod 8 (K and N odd, even, 2, 4 and 7 mod 8; K 7: a row is one short vector), one-row
    and one-column problems, operands starting 1 to 3 elements past their allocation's alignment, batches; each
    config twice (the K splits' tickets), output poisoned, against the float64 product (int8: exact)."""
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Generated
    from autotile.runtime.timing import relative_error

    shapes = [(67, 131, 257), (64, 130, 258), (33, 260, 1030), (1, 1001, 4097), (129, 3, 515), (16, 515, 2053),
              (96, 96, 97), (5, 17, 33), (7, 45, 7), (9, 70, 1023), (20, 36, 12)]
    batches = [(3, 33, 66, 131), (2, 65, 127, 260)]
    rng = cupy.random.default_rng(3)
    failures = []
    from autotile.runtime.device import live_device

    variants = [(name, {}) for name in NAMES[dtype]]
    if live_device().compute_capability == (9, 0):
        variants += [(name, {}) for name in DIRECT[dtype]]
    variants += [(name, overrides) for name in SKINNY.get(dtype, ()) for overrides in ({}, {"VEC": 8}, {"VEC": 2})]
    runs = []
    for name, overrides in variants:
        for kernel, cases in (("matmul", shapes), ("bmm", batches)):
            config = _realigned(name, kernel, **overrides)
            if kernels.get(kernel).space.is_feasible(config, Problem(PROFILES["h100"], dtype, layout)):
                runs.append((kernel, config, cases))  # (not: 8-wide vectors of a row-major skinny tile too wide)
    # Compiled in parallel first; preparing each config below then finds its kernel memoized.
    sources = [(kernels.get(kernel).render(config, dtype, layout), f"autotile_{kernel}") for kernel, config, _ in runs]
    for future in build.compile_many(sources, 8):
        future.result()
    for kernel, config, cases in runs:
        spec = kernels.get(kernel)
        for n, shape in enumerate(cases):
            inputs = spec.make_inputs(shape, dtype, layout, rng, cupy)
            if n % 2:  # every other problem: operands that start off 16 bytes
                inputs = tuple(_offset_view(x, cupy, 1 + (n // 2) % 3) for x in inputs)
            reference = spec.reference(inputs, dtype)
            out = cupy.empty(spec.output_shape(shape), dtype=dtypes.output_storage(dtype))
            runner = Generated(config).prepare(ProblemKey(kernel, dtype, layout, shape))
            for _ in range(2):
                kernels.poison(out)
                runner.run(inputs, out)
            error = relative_error(out, reference)
            if not error <= kernels.tolerance(dtype, shape[-1]):
                start = "offset" if n % 2 else "aligned start"
                failures.append(f"{config.key()} {kernel} {shape} ({start}): {error:.3g}")
    assert not failures, failures
