"""float64 and float32 matmul emulated on the int8 tensor cores (Ozaki scheme II), behind
precision="emulated". Without a GPU: the moduli, the choice of moduli and bits, the exact rebuild of the
integers (the kernel's own arithmetic, in Python), a model of the whole scheme against exact products, and
the kernels compiling for sm_80 and sm_90. On a GPU (`gpu` marker): every layout, shapes that are not
multiples of any tile, zero lines, NaN/Inf patterns identical to cuBLAS's, rows of wide exponent spread
(where the guard recomputes natively), and a property test over magnitudes, spreads, specials and shapes:
every element within a native GEMM's error bound K u (|A||B|)_ij, every time."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from direct_support import compile_once, require_hopper
from hypothesis import given, settings
from hypothesis import strategies as st

from autotile.codegen import build, kernels
from autotile.codegen import emulation as emu
from autotile.dispatch import precision
from autotile.errors import InvalidValueError

LAYOUTS = ("nn", "nt", "tn", "tt")


# -- the arithmetic -----------------------------------------------------------------------------------------


def test_moduli_are_pairwise_coprime_int8_sized_and_fit_128_bits():
    assert all(2 <= m <= 256 for m in emu.MODULI)
    for i, m in enumerate(emu.MODULI):
        for n in emu.MODULI[i + 1:]:
            assert math.gcd(m, n) == 1, (m, n)
    assert math.prod(emu.MODULI) < 2**127  # the rebuild's signed 128-bit join
    assert emu.MAX_K * 128 * 128 < 2**31 <= (emu.MAX_K + 1) * 128 * 128


@pytest.mark.parametrize("k", [1, 7, 4096, 8192, 16384, emu.MAX_K])
def test_beta_is_the_largest_that_keeps_q_far_from_a_half(k):
    for count in (4, 8, 12, 16):
        beta = emu.max_beta(k, count)
        product = math.prod(emu.MODULI[:count])
        assert k * 4**beta * 4 <= product < k * 4 ** (beta + 1) * 4


def test_scheme_takes_the_fewest_moduli_for_the_mantissa():
    s = emu.scheme("float64", 8192)
    assert (s.count, s.beta) == (16, 55)
    assert emu.max_beta(8192, 15) < 53
    s32 = emu.scheme("float32", 8192)
    assert (s32.count, s32.beta) == (9, 28) and emu.max_beta(8192, 8) < 26
    assert emu.scheme("float32", 8192, bits=24).count == 8
    assert emu.scheme("float64", 8192, bits=40).count < 16


@pytest.mark.parametrize("args, message", [
    (("float16", 64), "emulation computes float64 and float32; got float16"),
    (("float64", 0), "K 0 is outside 1..131071 (int8 products summed exactly in int32)"),
    (("float64", emu.MAX_K + 1), f"K {emu.MAX_K + 1} is outside 1..131071 (int8 products summed exactly in int32)"),
    (("float64", 8192, 80), "80 bits per operand at K 8192 need more than 16 moduli (at most 55 bits)"),
])
def test_scheme_refuses_in_one_line(args, message):
    with pytest.raises(InvalidValueError) as info:
        emu.scheme(*args)
    assert str(info.value) == message


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([("float64", 8192), ("float64", 3), ("float32", 100000), ("float32", 64)]), st.data())
def test_rebuild_recovers_every_integer_in_range(case, data):
    s = emu.scheme(*case)
    limit = s.k * 4**s.beta  # |S| at most this (A' and B' at most 2^beta)
    value = data.draw(st.one_of(st.integers(-limit, limit), st.sampled_from([-limit, limit, 0, 1, -1])))
    residues = [emu.symmetric_residue(value, m) for m in s.moduli]
    assert all(-128 <= r <= 127 for r in residues)
    assert emu.rebuild(residues, s) == value


def _model(a: np.ndarray, b: np.ndarray, s: emu.Scheme) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scheme on the host, step by step as the kernels take it: (C, the guard's error bound, the
    magnitudes' lower bound of |A||B|), all in float64."""
    m, k = a.shape
    n = b.shape[1]
    cap = emu.gain_cap(s)
    top_a = np.array([math.frexp(float(np.abs(r).max()))[1] for r in a])  # max |x| < 2^top
    top_b = np.array([math.frexp(float(np.abs(c).max()))[1] for c in b.T])
    # each line's exponent less its gain (`line_gain`)
    ea = top_a - np.array([emu.line_gain(emu.line_peak(list(r)), cap) for r in a])
    eb = top_b - np.array([emu.line_gain(emu.line_peak(list(c)), cap) for c in b.T])
    a_int = [[int(np.rint(np.ldexp(a[i, t], s.beta - ea[i]))) for t in range(k)] for i in range(m)]
    b_int = [[int(np.rint(np.ldexp(b[t, j], s.beta - eb[j]))) for j in range(n)] for t in range(k)]
    assert max(abs(x) for r in a_int for x in r) <= 2 ** (s.beta + cap)
    c = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            exact = sum(a_int[i][t] * b_int[t][j] for t in range(k))
            products = [sum(emu.symmetric_residue(a_int[i][t], md) * emu.symmetric_residue(b_int[t][j], md)
                            for t in range(k)) for md in s.moduli]
            residues = [emu.symmetric_residue(p, md) for p, md in zip(products, s.moduli, strict=True)]
            assert emu.rebuild(residues, s) == exact
            c[i, j] = math.ldexp(float(exact), int(ea[i] + eb[j]) - 2 * s.beta)
    sa = np.abs(a).sum(axis=1) / np.ldexp(1.0, ea)
    sb = np.abs(b).sum(axis=0) / np.ldexp(1.0, eb)
    bound = (np.ldexp(0.5, -s.beta) * (sa[:, None] + sb[None, :]) + 0.25 * k * np.ldexp(1.0, -2 * s.beta)) \
        * np.ldexp(1.0, ea[:, None] + eb[None, :])
    # the magnitudes' planes: each line's mean magnitude in [16, 32), clipped at 127
    ga = top_a + np.array([math.frexp(x / k)[1] for x in np.abs(a).sum(axis=1) / np.ldexp(1.0, top_a)]) + 2
    gb = top_b + np.array([math.frexp(x / k)[1] for x in np.abs(b).sum(axis=0) / np.ldexp(1.0, top_b)]) + 2
    mag_a = np.minimum(127, np.floor(np.ldexp(np.abs(a), 7 - ga[:, None])))
    mag_b = np.minimum(127, np.floor(np.ldexp(np.abs(b), 7 - gb[None, :])))
    floor_ab = (mag_a @ mag_b) * np.ldexp(1.0, ga[:, None] + gb[None, :] - 14)
    return c, bound, floor_ab


@pytest.mark.parametrize("dtype, bits", [("float64", None), ("float32", None), ("float64", 20), ("float32", 24)])
def test_the_scheme_on_the_host_stays_within_its_bound_of_the_exact_product(dtype, bits):
    rng = np.random.default_rng(7)
    m, n, k = 5, 4, 37
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-30, 30, (m, 1)))
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-3, 3, (k, n)))  # spread within columns
    a[1, 3] *= 2.0**20  # lines that peak (and gain bits), their largest values meeting
    b[3, 2] *= 2.0**20
    s = emu.scheme(dtype, k, bits)
    c, bound, floor_ab = _model(a, b, s)
    for i in range(m):
        for j in range(n):
            exact = sum(Fraction(float(a[i, t])) * Fraction(float(b[t, j])) for t in range(k))
            assert abs(Fraction(float(c[i, j])) - exact) <= Fraction(float(bound[i, j])) \
                + Fraction(float(abs(c[i, j]))) * Fraction(2, 2**53)
            assert Fraction(float(floor_ab[i, j])) <= sum(abs(Fraction(float(a[i, t])) * Fraction(float(b[t, j])))
                                                          for t in range(k))


def _scaled_line(values: list[float], beta: int, cap: int) -> list[int]:
    """A line's integers as the split kernels make them: rint(x 2^(beta - e)), e its exponent less its gain."""
    top = math.frexp(max(abs(v) for v in values))[1]
    e = top - emu.line_gain(emu.line_peak(values), cap)
    return [round(math.ldexp(v, beta - e)) for v in values]


def test_a_lines_gain_is_half_its_peak_less_one_within_the_cap():
    assert [emu.line_gain(p, 7) for p in range(1, 20)] == [0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7, 7]
    assert emu.line_gain(30, 0) == 0
    # the cap keeps both schemes' split arithmetic exact: float32's residues in floats up to 2^28
    assert emu.gain_cap(emu.scheme("float32", 8192)) == 0 and emu.gain_cap(emu.scheme("float32", 16384)) == 1
    assert emu.gain_cap(emu.scheme("float64", 8192)) == 62 - 55


@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
@pytest.mark.parametrize("k", [37, 4099, 65536])
def test_lines_gains_keep_every_product_inside_the_rebuilds_range(dtype, k):
    """|S_ij| <= K 4^beta, what the rebuild needs, for lines of every peak, worst aligned: each line all one
    sign, its largest value just under a power of two where the other line's is."""
    s = emu.scheme(dtype, k)
    cap = emu.gain_cap(s)
    rng = np.random.default_rng(k)

    def line(spread: int) -> list[float]:  # a largest value 1 - 2^-20 at k = 0, the rest 2^-spread times less
        rest = np.abs(rng.standard_normal(k - 1)) * 2.0**-spread if spread >= 0 else np.full(k - 1, 1 - 2.0**-20)
        return [1 - 2.0**-20, *(float(x) for x in np.minimum(rest, 1 - 2.0**-20))]

    kinds = {spread: line(spread) for spread in (-1, 0, 3, 8, 20, 60)}
    gains = {spread: emu.line_gain(emu.line_peak(v), cap) for spread, v in kinds.items()}
    if dtype == "float64" and k == 65536:
        assert max(gains.values()) >= 7  # lines keeping 7 bits more than beta
    for spread_a, a in kinds.items():
        ints_a = _scaled_line(a, s.beta, cap)
        for spread_b, b in kinds.items():
            ints_b = _scaled_line(b, s.beta, cap)
            total = sum(x * y for x, y in zip(ints_a, ints_b, strict=True))
            assert total <= k * 4**s.beta, (spread_a, spread_b, gains[spread_a], gains[spread_b])
            assert 4 * k * 4**s.beta <= s.modulus_product  # and that range is the rebuild's


# -- the kernels ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(build.nvrtc_unavailable_reason() is not None, reason="NVRTC is not available")
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernels_compile_for_ampere_and_hopper_without_spills(dtype, layout):
    source = emu.render(emu.scheme(dtype, 8192), layout)
    for arch in ("sm_80", "sm_90"):
        result = build.compile(source, arch, build.COMPILE_OPTIONS + emu.EXTRA_OPTIONS)
        names = {u.function for u in result.usages}
        assert names == set(emu.KERNEL_NAMES)
        assert all(u.spill_stores == 0 and u.stack_frame == 0 for u in result.usages), result.usages


def test_one_modulus_fewer_keeps_the_least_bits_or_is_not_offered():
    for dtype in emu.EMULATED_DTYPES:
        for k in (1, 257, 4096, 8192, 16384, 65536, emu.MAX_K):
            s = emu.scheme(dtype, k)
            f = emu.fewer(s)
            if f is None:
                assert emu.max_beta(k, s.count - 1) < emu.LEAST_BITS[dtype]
                continue
            assert f.moduli == s.moduli[:-1] and f.beta == emu.max_beta(k, f.count) >= emu.LEAST_BITS[dtype]
    assert (emu.fewer(emu.scheme("float64", 8192)).count, emu.fewer(emu.scheme("float64", 8192)).beta) == (15, 51)
    assert (emu.fewer(emu.scheme("float32", 8192)).count, emu.fewer(emu.scheme("float32", 8192)).beta) == (8, 24)


def test_normal_lines_choose_fewer_moduli_and_lines_of_wide_spread_do_not():
    rng = np.random.default_rng(5)
    for dtype in emu.EMULATED_DTYPES:
        f = emu.fewer(emu.scheme(dtype, 8192))
        normal = [emu.line_peak(list(rng.standard_normal(8192))) for _ in range(20)]
        assert max(normal) <= 4  # the largest of 2^13 normal values is about 4 times their mean magnitude
        assert emu.chooses_fewer(f, 8192, max(normal), max(normal))
        # values spread over +-20 binades at random: a sum of magnitudes led by its largest (peak 7, and the
        # independence the rule assumes holds); a line whose one large value dwarfs the rest does not pass
        spread = list(rng.standard_normal(8192) * np.exp2(rng.integers(-20, 21, 8192)))
        assert emu.line_peak(spread) <= 8
        outlier = list(rng.standard_normal(8192))
        outlier[5] = 2.0**20
        assert emu.line_peak(outlier) >= 12
        assert not emu.chooses_fewer(f, 8192, emu.line_peak(outlier), max(normal))
    # the threshold: (|A||B|)_ij as the lines' mean magnitudes make it, 2^PEAK_MARGIN_BITS above the bound
    f = emu.fewer(emu.scheme("float64", 8192))
    assert emu.fewer_exponent(f) == 51 + 1 - 53 - emu.PEAK_MARGIN_BITS
    assert emu.chooses_fewer(f, 8192, 7, 7) and not emu.chooses_fewer(f, 8192, 8, 1)


def test_the_scheme_of_fewer_moduli_reads_the_full_schemes_lines_and_planes():
    s = emu.scheme("float64", 8192)
    f = emu.fewer(s)
    full, fewer_source = emu.render(s, "nn"), emu.render(f, "nn", full=s)
    assert "constexpr int FEWER = 0;" in full and "constexpr int MAG_PLANE = 16;" in full
    assert "constexpr int FEWER = 1;" in fewer_source and "constexpr int MAG_PLANE = 16;" in fewer_source
    assert "constexpr int COUNT = 15;" in fewer_source and "constexpr int BETA = 51;" in fewer_source
    assert f"* {float(2.0**4).hex()} + rounding" in fewer_source  # the full scheme's bound terms, 2^(55 - 51) x
    assert f"ldexp((double)K, {emu.fewer_exponent(f)})" in full
    assert "*choice = 0;" in emu.render(emu.scheme("float64", 65536), "nn")  # no fewer scheme there


@pytest.mark.skipif(build.nvrtc_unavailable_reason() is not None, reason="NVRTC is not available")
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
def test_the_kernels_of_fewer_moduli_compile_without_spills(dtype):
    s = emu.scheme(dtype, 8192)
    result = build.compile(emu.render(emu.fewer(s), "tn", full=s), "sm_90", build.COMPILE_OPTIONS + emu.EXTRA_OPTIONS)
    assert {u.function for u in result.usages} == set(emu.KERNEL_NAMES)
    assert all(u.spill_stores == 0 and u.stack_frame == 0 for u in result.usages), result.usages


def test_render_refuses_unknown_layouts_and_knobs():
    s = emu.scheme("float64", 64)
    with pytest.raises(InvalidValueError, match="layout 'xx' is not one of nn, nt, tn, tt"):
        emu.render(s, "xx")
    with pytest.raises(InvalidValueError, match="unknown emulation knob"):
        emu.render(s, "nn", {"WARPS": 4})


def test_emulated_is_a_setting_that_allows_what_high_allows():
    assert precision.check("emulated") == "emulated"
    assert precision.allows("emulated", "high") and precision.loosest("emulated") == "high"


def test_emulation_is_chosen_only_for_large_2d_float_problems():
    from autotile.library import emulation

    assert emulation.pays("float64", (8192, 8192, 8192)) and emulation.pays("float32", (8192, 8192, 8192))
    assert not emulation.pays("float64", (4096, 4096, 4096)) and not emulation.pays("float32", (4096, 4096, 4096))
    assert not emulation.pays("float64", (16384, 16384, 1024))  # a short K: the int32 products' traffic
    assert not emulation.pays("float64", (64, 8192, 8192))
    assert not emulation.pays("float16", (8192, 8192, 8192))
    assert emulation.pays("float64", (2596, 13656, 10317))  # 2^38.4: measured 1.32x DGEMM (H200)
    assert not emulation.pays("float64", (2283, 8800, 11968))  # 2^37.8 (1.09x measured): under MIN_VOLUME
    assert not emulation.pays("float64", (8192, 8192, emu.MAX_K + 1))
    assert not emulation.pays("float64", (4, 8192, 8192, 8192))
    # K from 2048 (H200, the products' rows aligned: 1.02-1.60x from M N K 2^38; 0.90x at K 1590)
    assert emulation.pays("float64", (9774, 11370, 2585)) and emulation.pays("float64", (9415, 5500, 5424))
    assert not emulation.pays("float64", (16009, 13722, 1590))


def test_float32_is_emulated_over_the_kernels_that_split_once_only_on_the_largest_products():
    from autotile.codegen import kernels
    from autotile.library import emulation

    space = kernels.get("matmul").space
    presplit, tma = space.named("wgmma-128-presplit"), space.named("wgmma-128-tma-p2")
    shape = (8192, 8192, 8192)
    # measured 1.13x slower than the emulation with one modulus fewer and the sampled magnitudes (H200)
    assert emulation.pays("float32", shape, presplit)
    assert not emulation.pays("float32", (8192, 8192, 4096), presplit)  # a shorter K: the presplit kernels
    assert not emulation.pays("float32", (6144, 6144, 8192), presplit)  # a smaller product: the same
    assert emulation.pays("float32", shape, tma) and emulation.pays("float32", shape, None)  # None: cuBLAS
    assert emulation.pays("float64", shape, presplit)  # float64's native path is DGEMM: the config is not its
    assert not emulation.pays("float32", (4096, 4096, 4096), tma)  # the size rule still holds first
    # the largest products: the emulation outran the presplit kernels (12288³ 1.12x, 16384³ 1.19x, H200)
    assert emulation.pays("float32", (12288, 12288, 12288), presplit)
    assert not emulation.pays("float32", (10719, 13896, 5950), presplit)  # a tie there: a K under 8192


def test_the_library_weighs_what_high_runs_not_the_config_a_cublas_record_keeps(monkeypatch):
    from autotile.codegen import kernels
    from autotile.dispatch import select as select_mod
    from autotile.dispatch.select import Selection
    from autotile.library import calls

    presplit = kernels.get("matmul").space.named("wgmma-128-presplit")
    runs: dict[str, str] = {}
    monkeypatch.setattr(select_mod, "select", lambda key, device, precision=None: Selection(
        presplit, "exact", key.shape, implementation=runs[key.layout]))
    monkeypatch.setattr(calls, "_device", lambda device_id: None)
    monkeypatch.setattr(calls, "_emulation_choices", {})
    runs.update(nn="generated", nt="cublas")
    assert not calls.emulation_pays("matmul", "float32", "nn", (8192, 8192, 4096), 0)  # the presplit kernel runs
    assert calls.emulation_pays("matmul", "float32", "nt", (8192, 8192, 4096), 0)  # cuBLAS runs
    assert calls.emulation_pays("matmul", "float64", "nn", (8192, 8192, 8192), 0)
    assert not calls.emulation_pays("matmul", "float32", "nn", (2048, 2048, 2048), 0)  # the size rule first


# -- on a GPU -------------------------------------------------------------------------------------------------


def _operand(x: np.ndarray, order: str):
    import cupy

    return cupy.asarray(x) if order == "n" else cupy.asarray(x.T.copy()).T


@pytest.fixture
def emulate_everything(monkeypatch):
    """Every size emulated (the library's rule keeps small problems native)."""
    from autotile.library import emulation

    for name in ("MIN_SIDE", "MIN_K", "MIN_VOLUME"):
        monkeypatch.setattr(emulation, name, {"float64": 1, "float32": 1})
    # float32 too, whatever "high" runs
    monkeypatch.setattr(emulation, "native_outruns_emulation", lambda native, shape: False)


def _within_native_bound(out: np.ndarray, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """Elementwise: |out - AB| <= K u (|A||B|) (a native GEMM's worst case) plus half the smallest
    subnormal, AB in 64-bit-mantissa arithmetic; or both NaN, or both the same infinity; or, where
    (|A||B|)_ij is beyond the type's range, any infinity or NaN (a native sum may overflow on its way, to
    either sign)."""
    k = a.shape[1]
    u = 2.0**-53 if dtype == "float64" else 2.0**-24
    la, lb = a.astype(np.longdouble), b.astype(np.longdouble)
    with np.errstate(all="ignore"):
        ref = la @ lb
        abs_ab = np.abs(la) @ np.abs(lb)
        err = np.abs(out.astype(np.longdouble) - ref)
        ok = err <= k * u * abs_ab + np.finfo(dtype).smallest_subnormal
        beyond = ~np.isfinite(out) & (abs_ab > np.finfo(dtype).max)
    same_special = (np.isnan(out) & np.isnan(ref)) | (np.isinf(out) & (out == ref))
    return ok | same_special | beyond


def _assert_within_native_bound(out: np.ndarray, a: np.ndarray, b: np.ndarray, dtype: str) -> None:
    ok = _within_native_bound(out, a, b, dtype)
    if not ok.all():
        i, j = (int(x[0]) for x in np.nonzero(~ok))
        ref = (a[i].astype(np.longdouble) * b[:, j].astype(np.longdouble)).sum()
        raise AssertionError(f"{int((~ok).sum())} of {ok.size} elements outside the bound; first ({i}, {j}): "
                             f"{out[i, j]!r} against {float(ref)!r}, |A||B| "
                             f"{float((np.abs(a[i].astype(np.longdouble)) * np.abs(b[:, j])).sum())!r}, "
                             f"row max {np.abs(a[i]).max()!r}, column max {np.abs(b[:, j]).max()!r}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(131, 67, 257), (1, 1, 1), (33, 200, 1000), (256, 128, 4099)])
def test_emulated_matmul_is_within_a_native_bound(dtype, layout, shape, emulate_everything):
    import cupy

    import autotile

    m, n, k = shape
    rng = np.random.default_rng(hash((dtype, layout, shape)) % 2**32)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = cupy.full((m, n), np.nan, dtype)  # poisoned
    result = autotile.matmul(_operand(a, layout[0]), _operand(b, layout[1]), out=out, precision="emulated")
    assert result is out
    got = cupy.asnumpy(out)
    _assert_within_native_bound(got, a, b, dtype)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    native = cupy.asnumpy(_operand(a, layout[0]) @ _operand(b, layout[1]))
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    native_err = np.linalg.norm(native - ref) / np.linalg.norm(ref)
    if dtype == "float32":  # float64's reference is itself a float64 product: compare float32 only
        assert err <= max(2 * native_err, 2**-24)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "tt"])  # each operand's lines along memory and across it
def test_blocks_that_loop_over_lines_cover_them_all(layout, emulate_everything, monkeypatch):
    """GRID_WAVES 0: one row of blocks, each looping over every line of the split kernels and every row of
    the rebuild (the grids of large calls do likewise for the lines past their waves)."""
    import cupy

    import autotile

    monkeypatch.setattr(emu, "GRID_WAVES", 0)
    m, n, k = 301, 517, 1031
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    out = cupy.full((m, n), np.nan)  # poisoned
    autotile.matmul(_operand(a, layout[0]), _operand(b, layout[1]), out=out, precision="emulated")
    got = cupy.asnumpy(out)
    _assert_within_native_bound(got, a, b, "float64")
    assert np.linalg.norm(got - a @ b) / np.linalg.norm(a @ b) < 1e-14


@pytest.mark.gpu
def test_a_peaked_row_keeps_the_bits_of_its_gain(emulate_everything, monkeypatch):
    """A float64 row whose one large value (2^12 times the rest) meets a zero row of B, so that the product is
    carried by the row's small values: each element is the host model's, lines' gains included (the row
    gains 5 bits), to 2 ulps; rounded to beta bits below the row's largest value instead, the small values
    would move the product by tens of ulps."""
    import cupy

    import autotile
    from autotile.library import emulation

    monkeypatch.setattr(emulation, "FEWER_MODULI", False)  # the full scheme: the one modelled here
    m, n, k = 3, 8, 4099
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((k, n))
    a[1, 5] = 1.3 * 2.0**12
    b[5, :] = 0.0
    out = cupy.asnumpy(autotile.matmul(cupy.asarray(a), cupy.asarray(b), precision="emulated"))
    s = emu.scheme("float64", k)
    cap = emu.gain_cap(s)
    assert emu.line_gain(emu.line_peak(list(a[1])), cap) == 5
    for gains in (cap, 0):
        far = 0
        for i in range(m):
            row = _scaled_line(list(a[i]), s.beta, gains)
            e = math.frexp(float(np.abs(a[i]).max()))[1] - emu.line_gain(emu.line_peak(list(a[i])), gains)
            for j in range(n):
                column = _scaled_line(list(b[:, j]), s.beta, gains)
                f = math.frexp(float(np.abs(b[:, j]).max()))[1] - emu.line_gain(emu.line_peak(list(b[:, j])), gains)
                model = math.ldexp(float(sum(x * y for x, y in zip(row, column, strict=True))), e + f - 2 * s.beta)
                ulps = abs(out[i, j] - model) / math.ulp(model)
                if gains:
                    assert ulps <= 2, (i, j, out[i, j], model)
                far = max(far, ulps)
        if not gains:
            assert far > 16  # the model without the gains is far from what ran


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
def test_specials_zero_lines_and_wide_spread_keep_native_semantics(dtype, emulate_everything):
    import cupy

    import autotile

    rng = np.random.default_rng(3)
    m, n, k = 150, 130, 300
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    a[3, 7], a[70, :] = np.nan, 0.0
    a[100, 5], b[9, 120] = np.inf, -np.inf
    b[:, 40] = 0.0
    b[11, 60] = np.inf
    a[5, 11] = 0.0  # 0 * Inf: NaN in C[5, 60]
    # a row whose large element meets zeros and whose small ones carry the product: the guard's case
    a[20, :] = 1.0
    a[20, 0] = 1e30 if dtype == "float64" else 1e18
    b[0, 90:] = 0.0
    out = cupy.asnumpy(autotile.matmul(cupy.asarray(a), cupy.asarray(b), precision="emulated"))
    native = cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b))
    assert np.array_equal(np.isnan(out), np.isnan(native))
    assert np.array_equal(np.isposinf(out), np.isposinf(native))
    assert np.array_equal(np.isneginf(out), np.isneginf(native))
    for line in (out[70], out[:, 40]):  # zero lines give zeros, but where they meet an Inf (0 * Inf: NaN)
        assert (line[np.isfinite(line)] == 0).all()
    _assert_within_native_bound(out, a, b, dtype)


@pytest.mark.gpu
@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from(emu.EMULATED_DTYPES), m=st.integers(1, 90), n=st.integers(1, 90),
       k=st.integers(1, 700), row_spread=st.integers(0, 60), element_spread=st.integers(0, 40),
       specials=st.integers(0, 3), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**31))
def test_property_every_element_within_the_bound_or_native(dtype, m, n, k, row_spread, element_spread, specials,
                                                           layout, seed):
    import cupy

    import autotile
    from autotile.library import emulation

    original = emulation.pays
    emulation.pays = lambda dtype, shape, native=None: True
    try:
        rng = np.random.default_rng(seed)
        limit = 60 if dtype == "float32" else 300
        spread = lambda shape, bits: np.exp2(rng.integers(-min(bits, limit), min(bits, limit) + 1, shape))  # noqa: E731
        a = (rng.standard_normal((m, k)) * spread((m, 1), row_spread) * spread((m, k), element_spread)).astype(dtype)
        b = (rng.standard_normal((k, n)) * spread((1, n), row_spread) * spread((k, n), element_spread)).astype(dtype)
        for _ in range(specials):
            x = a if rng.random() < 0.5 else b
            x[rng.integers(x.shape[0]), rng.integers(x.shape[1])] = rng.choice([np.nan, np.inf, -np.inf, 0.0])
        out = cupy.asnumpy(autotile.matmul(_operand(a, layout[0]), _operand(b, layout[1]), precision="emulated"))
        _assert_within_native_bound(out, a, b, dtype)
    finally:
        emulation.pays = original


@pytest.mark.gpu
def test_torch_tensors_take_the_emulated_path(emulate_everything):
    torch = pytest.importorskip("torch")
    import autotile

    a = torch.randn(97, 301, dtype=torch.float64, device="cuda")
    b = torch.randn(301, 89, dtype=torch.float64, device="cuda")
    out = autotile.matmul(a, b, precision="emulated")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    ref = a.double().cpu().numpy() @ b.double().cpu().numpy()
    _assert_within_native_bound(out.cpu().numpy(), a.cpu().numpy(), b.cpu().numpy(), "float64")
    assert np.linalg.norm(out.cpu().numpy() - ref) / np.linalg.norm(ref) < 1e-14


def _kernel_residue(v: float, m: int, s: emu.Scheme) -> int:
    """The split kernel's residue byte of the integer v (a value of the kernel's type), step by step as the
    template computes it: v cut into vh 2^bits + vl, y = vh c + vl (c = 2^bits mod m), y + MAGIC from a
    second FMA, q + MAGIC from a third, and the residue as the difference of their low bits times m in 32-bit
    integers. Each FMA rounds once: computed exactly in fractions and rounded to the kernel's type."""
    from fractions import Fraction

    real = emu.residue_real(s)

    def rounded(x: Fraction) -> float:  # to the nearest double; then float32 (no tie falls between them here)
        return float(x) if real == "double" else float(np.float32(float(x)))

    magic = 1.5 * 2.0**52 if real == "double" else 1.5 * 2.0**23
    inv = 1.0 / m if real == "double" else float(np.float32(1.0 / m))
    bits = emu.split_bits(s)
    c = emu.symmetric_residue(2**bits, m)
    vh = rounded(Fraction(v) * Fraction(2) ** -bits + Fraction(magic)) - magic
    vl = rounded(Fraction(v) - Fraction(vh) * 2**bits)
    assert Fraction(vl) == Fraction(v) - Fraction(vh) * 2**bits and abs(vl) <= 2 ** (bits - 1)
    vl_magic = rounded(Fraction(vl) + Fraction(magic))
    y = rounded(Fraction(vh) * c + Fraction(vl))
    assert Fraction(y) == Fraction(vh) * c + Fraction(vl)  # exact: far inside the type's integers
    y_magic = rounded(Fraction(vh) * c + Fraction(vl_magic))
    q_magic = rounded(Fraction(y) * Fraction(inv) + Fraction(magic))

    def low_bits(x: float) -> int:  # x = MAGIC + i: x's low 32 bits hold i mod 2^32
        assert x == int(x) and abs(x - magic) < magic / 3  # within the binade where an ulp is 1
        return int(x - magic) % 2**32

    r = (low_bits(y_magic) - low_bits(q_magic) * m + 2**31) % 2**32 - 2**31  # 32-bit integers wrap
    assert -128 <= r <= 128 and (r - int(y)) % m == 0  # the nearest quotient: the residue is this small
    return (r + 128) % 256 - 128  # the byte the kernel stores, read as int8


@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
@pytest.mark.parametrize("k", [1000, 8192, 16384])
@pytest.mark.parametrize("which", ["full", "fewer"])
def test_the_split_kernels_floating_point_residues_are_exact(dtype, k, which):
    full = emu.scheme(dtype, k)
    s = full if which == "full" else emu.fewer(full)
    assert s is not None
    rng = np.random.default_rng(11)
    top = 2 ** (s.beta + emu.gain_cap(full))  # a line's largest scaled value, its gain included
    values = [0, 1, -1, top, -top, top - 1, 1 - top] + [int(x) for x in rng.integers(-top, top, 400)]
    # and values a half of a modulus from a multiple of it, where the nearest quotient is decided
    values += [q * m + (m // 2) * sign for m in s.moduli for q in (0, 1, 12345, top // m - 1) for sign in (-1, 1)]
    # the scaled values are the inputs' own significands times a power of two: 53 or 24 significant bits
    values = [int(np.float64(v)) if dtype == "float64" else int(np.float32(v)) for v in values]
    for v in values:
        for m in s.moduli:
            assert _kernel_residue(float(v), m, s) == emu.symmetric_residue(v, m), (v, m)


@pytest.mark.gpu
def test_small_calls_under_emulated_run_the_native_path_bit_for_bit():
    import cupy

    import autotile

    rng = np.random.default_rng(5)
    for dtype in emu.EMULATED_DTYPES:
        a = cupy.asarray(rng.standard_normal((300, 257)).astype(dtype))
        b = cupy.asarray(rng.standard_normal((257, 129)).astype(dtype))
        emulated = autotile.matmul(a, b, precision="emulated")
        native = autotile.matmul(a, b, precision="high")
        assert cupy.array_equal(emulated, native)


@pytest.mark.gpu
def test_a_shape_that_pays_takes_the_emulation_and_matches_the_exact_product(monkeypatch):
    import cupy

    import autotile
    from autotile.cli.bench_emulation import sampled_errors
    from autotile.library import emulation

    taken = []
    real_run = emulation.run
    monkeypatch.setattr(emulation, "run", lambda *args, **kw: taken.append(args[5]) or real_run(*args, **kw))
    shape = (8192, 8192, 8192)
    assert emulation.pays("float64", shape)
    g = cupy.random.default_rng(2)
    a, b = g.standard_normal((8192, 8192)), g.standard_normal((8192, 8192))
    out = autotile.matmul(a, b, precision="emulated")
    assert taken == [shape]
    emulated_error, native_error = sampled_errors([out, a @ b], a, b, 32, 3)
    assert emulated_error <= native_error


@pytest.mark.gpu
@pytest.mark.parametrize("a_shape, b_shape", [((3, 67, 131), (3, 131, 45)), ((67, 131), (2, 131, 45)),
                                              ((2, 67, 131), (131, 45))])
def test_batches_emulate_each_matrix(a_shape, b_shape, emulate_everything):
    import cupy

    import autotile

    rng = np.random.default_rng(9)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    out = cupy.asnumpy(autotile.matmul(cupy.asarray(a), cupy.asarray(b), precision="emulated"))
    batch = max(x.shape[0] for x in (a, b) if x.ndim == 3)
    a3 = a if a.ndim == 3 else np.stack([a] * batch)
    b3 = b if b.ndim == 3 else np.stack([b] * batch)
    assert out.shape == (a3.shape[0], 67, 45)
    for index in range(out.shape[0]):
        _assert_within_native_bound(out[index], a3[index], b3[index], "float64")


def test_the_library_weighs_the_padded_plan_high_would_run(monkeypatch):
    """An odd float32 shape that "high" pads onto a presplit kernel is not emulated; where the padded plan
    does not pay, what the shape runs as it is decides."""
    from autotile.codegen import kernels
    from autotile.dispatch import select as select_mod
    from autotile.dispatch.select import Selection
    from autotile.library import calls, padding

    space = kernels.get("matmul").space
    presplit, other = space.named("wgmma-128-presplit"), space.named("tf32x3-64")
    shape = (8191, 8191, 8191)  # rows of 8191 floats: not 16-byte aligned
    assert padding.applies("float32", "high", "matmul", "nn", shape)
    padded_pays = [True]
    monkeypatch.setattr(select_mod, "select", lambda key, device, precision=None: Selection(
        other if key.shape == shape else presplit, "model", None))
    monkeypatch.setattr(padding, "pays", lambda direct, padded, layout, shape, dtype: padded_pays[0])
    monkeypatch.setattr(calls, "_device", lambda device_id: None)
    monkeypatch.setattr(calls, "_emulation_choices", {})
    assert not calls.emulation_pays("matmul", "float32", "nn", shape, 0)  # the padded presplit kernel runs
    padded_pays[0] = False
    monkeypatch.setattr(calls, "_emulation_choices", {})
    assert calls.emulation_pays("matmul", "float32", "nn", shape, 0)  # tf32x3-64 on the shape as it is


# -- the int8 kernels' residue epilogue -----------------------------------------------------------------------

INT8_DIRECT = [name for name, config in kernels.get("matmul").space.named_configs.items()
               if config["MATH"] == "wgmma_direct" and config["BK"] == 128]


@pytest.mark.skipif(build.nvrtc_unavailable_reason() is not None, reason="NVRTC is not available")
@pytest.mark.parametrize("name", INT8_DIRECT)
def test_int8_residue_epilogue_compiles_and_leaves_the_plain_kernel_alone(name):
    spec = kernels.get("matmul")
    config = spec.space.named_configs[name]
    plain = spec.render(config, "int8", "nt")
    residues = spec.render(config, "int8", "nt", {"RESIDUES": True})
    assert "modulus" not in plain and "int M, int N, int K, int modulus" in residues
    assert "using TC = signed char;" in residues and "RESIDUES=True" in residues
    result = compile_once(residues, "sm_90a")  # the -p configs' kernels are the same code as their others'
    assert all(u.spill_stores == 0 for u in result.usages)


@pytest.mark.skipif(build.nvrtc_unavailable_reason() is not None, reason="NVRTC is not available")
def test_int8_skip_variant_takes_a_word_and_returns_where_it_is_set():
    spec = kernels.get("matmul")
    config = spec.space.named_configs["direct8-128x256-c2p"]
    plain, skipping = spec.render(config, "int8", "nt"), spec.render(config, "int8", "nt", {"SKIP": True})
    assert "skip" not in plain and "int M, int N, int K, const int* __restrict__ skip" in skipping
    assert "if (*skip != 0) return;" in skipping
    assert all(u.spill_stores == 0 for u in compile_once(skipping, "sm_90a").usages)


@pytest.mark.gpu
def test_the_product_of_the_modulus_left_out_is_skipped_where_its_word_says_so():
    require_hopper()
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import Selection
    from autotile.library import calls
    from autotile.runtime.impl import Generated
    from autotile.runtime.operands import framework_by_type

    m, n, k = 300, 200, 1024
    g = cupy.random.default_rng(9)
    a = g.integers(-128, 128, (m, k), dtype=cupy.int8)
    b = g.integers(-128, 128, (n, k), dtype=cupy.int8)
    config = kernels.get("matmul").space.named("direct8-128x256-c2p")
    prepared = calls._Prepared(Generated(config).prepare(ProblemKey("matmul", "int8", "nt", (m, n, k))),
                               Selection(config, "forced", None))
    products = calls._Int8Products(prepared, (m, n, k), framework_by_type(a, b).allocate)
    word = cupy.ones(1, cupy.int32)
    launch = products.unless(word.data.ptr)
    assert launch is not None
    stream = cupy.cuda.get_current_stream().ptr
    out = cupy.full((m, n), 7, cupy.int32)
    launch((a.data.ptr, b.data.ptr), out.data.ptr, out.nbytes, stream)
    assert bool((out == 7).all())  # skipped: untouched
    word.fill(0)
    launch((a.data.ptr, b.data.ptr), out.data.ptr, out.nbytes, stream)
    assert np.array_equal(cupy.asnumpy(out), cupy.asnumpy(a).astype(np.int64) @ cupy.asnumpy(b).astype(np.int64).T)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
def test_the_inputs_choose_the_moduli_and_either_choice_keeps_the_bound(dtype):
    """Normal inputs (line peaks of 3-4) run one modulus fewer; a row whose one value dwarfs the rest keeps them
    all; both within a native GEMM's bound; with the choice off, every modulus."""
    import cupy

    from autotile.library import calls, emulation
    from autotile.library.plan import plan_matmul
    from autotile.runtime.operands import as_framework, framework_by_type

    m, n, k = 96, 80, 8192
    rng = np.random.default_rng(12)
    normal_a = rng.standard_normal((m, k)).astype(dtype)
    wide_a = normal_a.copy()
    wide_a[17, 5] = 2.0**20  # a row whose one value dwarfs the rest: a peak of 13
    b = rng.standard_normal((k, n)).astype(dtype)
    reports = {}
    for name, a_host, fewer_moduli in (("normal", normal_a, None), ("wide", wide_a, None), ("off", normal_a, False)):
        a, b_dev = cupy.asarray(a_host), cupy.asarray(b)
        out = cupy.full((m, n), cupy.nan, dtype)
        framework = framework_by_type(a, b_dev)
        op_a, op_b, op_c = (as_framework(framework, x, label) for x, label in ((a, "A"), (b_dev, "B"), (out, "out")))
        plan = plan_matmul(op_a.shape, op_a.strides, op_b.shape, op_b.strides)
        report: dict[str, int] = {}
        emulation.run(framework, op_a, op_b, op_c, plan.layout, plan.shape, cupy.cuda.get_current_stream().ptr,
                      calls._int8_gemm(framework, op_a.device), report=report, fewer_moduli=fewer_moduli)
        _assert_within_native_bound(cupy.asnumpy(out), a_host, b, dtype)
        reports[name] = report["fewer_moduli"]
    assert reports == {"normal": 1, "wide": 0, "off": 0}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
@pytest.mark.parametrize("inputs", ["normal", "an outlier row"])
def test_sampled_magnitudes_rebuild_the_same_bits_as_the_full_product(dtype, inputs):
    """The guard on the magnitudes of every fourth element of K, the full product only where that fails an
    element: the same elements recomputed natively, the same bits, as the full product from the start."""
    require_hopper()
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import Selection
    from autotile.library import calls, emulation
    from autotile.library.plan import plan_matmul
    from autotile.runtime.impl import Generated
    from autotile.runtime.operands import as_framework, framework_by_type

    m, n, k = 300, 260, 4099
    rng = np.random.default_rng(21)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    if inputs != "normal":
        a[7, 3] = 2.0**40  # meets B's small values: elements the guard cannot vouch for
    a_dev, b_dev = cupy.asarray(a), cupy.asarray(b)
    framework = framework_by_type(a_dev, b_dev)
    op_a, op_b = as_framework(framework, a_dev, "A"), as_framework(framework, b_dev, "B")
    plan = plan_matmul(op_a.shape, op_a.strides, op_b.shape, op_b.strides)
    config = kernels.get("matmul").space.named("direct8-128x256-c2p")

    def generated_products(shape):  # a kernel the full product's launch can skip on
        key = ProblemKey("matmul", "int8", "nt", shape)
        prepared = calls._Prepared(Generated(config).prepare(key), Selection(config, "forced", None))
        return calls._Int8Products(prepared, shape, framework.allocate)

    outs, reports = [], []
    for sampled in (False, True):
        out = cupy.full((m, n), cupy.nan, dtype)
        report: dict[str, int] = {}
        emulation.run(framework, op_a, op_b, as_framework(framework, out, "out"), plan.layout, plan.shape,
                      cupy.cuda.get_current_stream().ptr, generated_products, report=report,
                      sampled_magnitudes=sampled)
        outs.append(cupy.asnumpy(out))
        reports.append(report)
    assert reports[1]["full_magnitudes"] == (0 if inputs == "normal" else 1)
    assert reports[0]["failed_runs"] == reports[1]["failed_runs"]
    assert (reports[1]["failed_runs"] > 0) == (inputs != "normal")
    assert np.array_equal(outs[0], outs[1])
    _assert_within_native_bound(outs[1], a, b, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(131, 67, 272), (300, 200, 1024), (1000, 1000, 4096)])
def test_int8_residue_epilogue_matches_the_int32_sums(shape):
    import cupy

    from autotile.library import calls
    from autotile.runtime.operands import framework_by_type

    m, n, k = shape
    g = cupy.random.default_rng(4)
    a = g.integers(-128, 128, (m, k), dtype=cupy.int8)
    b = g.integers(-128, 128, (n, k), dtype=cupy.int8)
    framework = framework_by_type(a, b)
    products = calls._int8_gemm(framework, a.device.id)(shape)
    sums = cupy.empty((m, n), cupy.int32)
    stream = cupy.cuda.get_current_stream().ptr
    products((a.data.ptr, b.data.ptr), sums.data.ptr, sums.nbytes, stream)
    expected_sums = cupy.asnumpy(sums)
    assert np.array_equal(expected_sums, cupy.asnumpy(a).astype(np.int64) @ cupy.asnumpy(b).astype(np.int64).T)
    launched = 0
    for modulus in (256, 255, 193):
        launch = products.residues(modulus)
        if launch is None:  # the selection runs cuBLAS, or a kernel whose splits add atomically
            continue
        out = cupy.full((m, n), 99, cupy.int8)
        launch((a.data.ptr, b.data.ptr), out.data.ptr, stream)
        expected = np.vectorize(lambda v, md=modulus: emu.symmetric_residue(int(v), md))(expected_sums)
        assert np.array_equal(cupy.asnumpy(out), expected.astype(np.int8))
        launched += 1
    assert launched in (0, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
def test_int32_and_residue_products_rebuild_the_same_bits(dtype, emulate_everything, monkeypatch):
    import cupy

    import autotile
    from autotile.library import calls, emulation
    from autotile.library.plan import plan_matmul
    from autotile.runtime.operands import as_framework, framework_by_type

    g = cupy.random.default_rng(6)
    a = g.standard_normal((700, 1100)).astype(dtype)
    b = g.standard_normal((1100, 900)).astype(dtype)
    plain = autotile.matmul(a, b, precision="emulated")  # int32 sums, reduced by the rebuild
    monkeypatch.setattr(emulation, "RESIDUE_EPILOGUE", True)
    report: dict[str, int] = {}
    fused = cupy.empty_like(plain)
    framework = framework_by_type(a, b)
    op_a, op_b, op_c = (as_framework(framework, x, name) for x, name in ((a, "A"), (b, "B"), (fused, "out")))
    plan = plan_matmul(op_a.shape, op_a.strides, op_b.shape, op_b.strides)
    emulation.run(framework, op_a, op_b, op_c, plan.layout, plan.shape, cupy.cuda.get_current_stream().ptr,
                  calls._int8_gemm(framework, op_a.device), report=report)
    assert cupy.array_equal(fused, plain)
    assert report["residue_epilogue"] in (0, 1)  # 0 where the selection runs cuBLAS for these int8 products


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
@pytest.mark.parametrize("products_on", ["cublas", "direct8-128x256-c2p"])
def test_products_in_one_batched_call_rebuild_the_same_bits(dtype, products_on):
    """The products as one batched launch (cuBLAS's batched GEMM, or a generated kernel batched: its 3-D maps)
    rebuild the bits of one launch a product, guard and fix-up included."""
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import Selection
    from autotile.library import calls, emulation
    from autotile.library.plan import plan_matmul
    from autotile.runtime.cublas import CublasCall
    from autotile.runtime.impl import Cublas, Generated
    from autotile.runtime.operands import as_framework, framework_by_type

    if products_on != "cublas":
        require_hopper()
    g = cupy.random.default_rng(8)
    a = g.standard_normal((700, 1100)).astype(dtype)
    b = g.standard_normal((1100, 900)).astype(dtype)
    b[3, 5] = 1e25  # a column spread over 25 decades: the guard sends it to the fix-up (the magnitudes are read)
    framework = framework_by_type(a, b)
    op_a, op_b = as_framework(framework, a, "A"), as_framework(framework, b, "B")
    plan = plan_matmul(op_a.shape, op_a.strides, op_b.shape, op_b.strides)
    device = op_a.device

    def forced_products(shape):  # cuBLAS's int8 GEMM or the named kernel, whatever the selection would run
        key = ProblemKey("matmul", "int8", "nt", shape)
        if products_on == "cublas":
            prepared = calls._Prepared(Cublas().prepare(key), Selection(None, "forced", None, None, "cublas"),
                                       direct=CublasCall(key, device))
        else:
            config = kernels.get("matmul").space.named(products_on)
            prepared = calls._Prepared(Generated(config).prepare(key), Selection(config, "forced", None))
        return calls._Int8Products(prepared, shape, framework.allocate)

    outs, reports = [], []
    for batched in (False, True):
        out = cupy.full((700, 900), cupy.nan, dtype)
        report: dict[str, int] = {}
        emulation.run(framework, op_a, op_b, as_framework(framework, out, "out"), plan.layout, plan.shape,
                      cupy.cuda.get_current_stream().ptr, forced_products, report=report,
                      batched_products=batched)
        outs.append(out)
        reports.append(report)
    assert [r["batched_products"] for r in reports] == [0, 1]
    assert reports[0]["failed_runs"] == reports[1]["failed_runs"] > 0
    assert cupy.array_equal(outs[0], outs[1])
    _assert_within_native_bound(cupy.asnumpy(outs[1]), cupy.asnumpy(a), cupy.asnumpy(b), dtype)


def test_large_products_run_the_models_runner_up_where_it_was_predicted_close(monkeypatch):
    """The emulation's products, a dozen of one shape back to back, run the int8 model's runner-up instead
    of cuBLAS from `SUSTAINED_MIN_WORK` multiply-adds where it was predicted at least `SUSTAINED_FLOOR` x
    cuBLAS on one product; smaller products, a farther runner-up, a generated choice or a tuned record keep
    the selection."""
    import contextlib
    import dataclasses

    from autotile.dispatch import select
    from autotile.library import calls, emulation
    from autotile.runtime import impl

    config = kernels.get("matmul").space.named("direct8-128x256-c2p")
    predicted = {"value": 0.95}
    monkeypatch.setattr(calls, "_device", lambda device_id: None)
    monkeypatch.setattr(calls, "_device_of", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(calls, "_sustained", {})
    monkeypatch.setattr(impl.Generated, "prepare", lambda self, key: ("runner", self.config, key.shape))
    monkeypatch.setattr(select, "runner_up", lambda key, device: (config, predicted["value"]))
    by_model = select.Selection(None, "model (615 surveyed shapes)", None, None, "cublas", "cuBLAS kept", step="model")
    cublas = calls._Prepared("cuBLAS", by_model, direct=object())  # type: ignore[arg-type]
    big = (8192, 8192, 8192)
    chosen = calls._sustained_products(cublas, big, 0)
    assert chosen.direct is None and chosen.selection.config == config and chosen.runner == ("runner", config, big)
    assert "runner-up, predicted 0.95x" in chosen.selection.explain()
    assert calls._sustained_products(cublas, big, 0) is chosen  # decided once
    small = (4096, 4096, 4096)
    assert emulation.SUSTAINED_MIN_WORK > math.prod(small)
    assert calls._sustained_products(cublas, small, 0) is cublas
    predicted["value"] = emulation.SUSTAINED_FLOOR - 0.01
    assert calls._sustained_products(cublas, (8192, 8192, 16384), 0) is cublas
    tuned = calls._Prepared("cuBLAS", dataclasses.replace(by_model, step="exact"), direct=object())  # type: ignore[arg-type]
    assert calls._sustained_products(tuned, (16384, 16384, 16384), 0) is tuned
    by_kernel = dataclasses.replace(by_model, config=config, implementation="generated")
    generated = calls._Prepared("kernel", by_kernel)  # type: ignore[arg-type]
    assert calls._sustained_products(generated, (16384, 16384, 8192), 0) is generated


def test_the_emulation_benchmarks_random_shapes_round_up_to_a_multiple():
    """`bench-emulation --random N --multiple Q`: the same draw, each side rounded up to a multiple of Q."""
    from autotile.cli.bench_emulation import random_shapes

    plain, rounded = random_shapes(12, seed=41), random_shapes(12, seed=41, multiple=64)
    assert plain == random_shapes(12, seed=41) and len(plain) == 12
    assert all(1024 <= side <= 16384 for shape in plain for side in shape)
    for before, after in zip(plain, rounded, strict=True):
        assert all(a % 64 == 0 and 0 <= a - b < 64 for a, b in zip(after, before, strict=True))


# -- what a call enqueues (stand-ins for the kernels, the products and the framework: no GPU) -----------------


class _Recorder:
    """Stands in for the emulation's kernels, its int8 products and its framework: records what is launched."""

    def __init__(self, generated: bool):
        self.launches: list[tuple[Any, ...]] = []
        self.grids: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.generated = generated  # whether the products run a kernel that a device word can stop
        self.next_address = 1 << 20

    def allocate(self, elems: int, dtype: str, stream_ptr: int) -> tuple[None, int]:
        address = self.next_address
        self.next_address += (elems * np.dtype(dtype).itemsize + 255) // 256 * 256
        return None, address

    def kernel(self, scheme: str, name: str) -> Any:
        def launch(grid: Any, block: Any, args: tuple[Any, ...], stream: Any = None) -> None:
            self.launches.append((name, scheme, *(int(a) for a in args)))
            self.grids[name, scheme] = tuple(grid)
        return launch

    def int8_gemm(self, shape: tuple[int, int, int]) -> Any:
        recorder = self

        class Products:
            def __call__(self, pointers: Any, out: int, nbytes: int, stream: int) -> None:
                recorder.launches.append(("product", shape, pointers, out))

            def residues(self, modulus: int) -> None:
                return None

            def batched(self, count: int) -> None:
                return None

            def unless(self, word: int) -> Any:
                if not recorder.generated:
                    return None
                return lambda pointers, out, nbytes, stream: recorder.launches.append(
                    ("product unless", shape, pointers, out, word))

        return Products()


def _enqueued(monkeypatch: Any, dtype: str, generated: bool, shape: tuple[int, int, int] = (1000, 900, 8192),
              recorder: _Recorder | None = None, **switches: Any) -> tuple[list[tuple[Any, ...]], Any]:
    from types import SimpleNamespace

    import cupy

    from autotile.library import emulation
    from autotile.runtime import impl
    from autotile.runtime.operands import Operand

    recorder = recorder or _Recorder(generated)

    def kernels_of(s: Any, layout: str, device: int, full: Any = None) -> Any:
        scheme = "fewer" if full is not None else "full"
        return SimpleNamespace(functions={name: recorder.kernel(scheme, name) for name in emu.KERNEL_NAMES})

    monkeypatch.setattr(emulation, "_kernels", kernels_of)
    monkeypatch.setattr(emulation, "_stream_words", {})
    monkeypatch.setattr(impl, "cupy_stream", lambda pointer: None)
    monkeypatch.setattr(impl, "sm_count", lambda: SMS)
    monkeypatch.setattr(cupy.cuda.runtime, "memsetAsync", lambda *args: None)
    m, n, k = shape
    a = Operand(None, 16, (m, k), (k, 1), dtype, 0)
    b = Operand(None, 32, (k, n), (n, 1), dtype, 0)
    c = Operand(None, 48, (m, n), (n, 1), dtype, 0)
    framework = SimpleNamespace(allocate=recorder.allocate)
    emulation.run(framework, a, b, c, "nn", (m, n, k), 7, recorder.int8_gemm, **switches)  # type: ignore[arg-type]
    return recorder.launches, (m, n, k)


SMS = 132  # the recorded calls' GPU: an H100's SMs


def test_capped_rows_stop_at_the_waves_and_keep_at_least_one():
    assert emu.capped_rows(32, 8192, 8, SMS) == -(-emu.GRID_WAVES * 8 * SMS // 32)
    assert emu.capped_rows(32, 10, 8, SMS) == 10  # fewer rows than the cap: one block each
    assert emu.capped_rows(10**6, 8192, 3, SMS) == 1  # wide enough already: one row of blocks, looping
    assert emu.capped_rows(1, 10**6, 8, 10**4) == 65535  # CUDA's limit on y


def test_the_split_and_rebuild_grids_cover_every_line_and_stop_at_the_waves(monkeypatch):
    """At 8192 x 8192 a did-nothing kernel of the scheme not chosen costs its blocks' launches (0.26 ms a call
    uncapped): the grids stop at GRID_WAVES waves of resident blocks, and their blocks loop over the rest."""
    from autotile.library import emulation as emu_lib

    recorder = _Recorder(True)
    m, n, k = 8192, 8191, 8200
    _enqueued(monkeypatch, "float64", True, (m, n, k), recorder)
    kp = -(-k // emu_lib.K_ALIGN) * emu_lib.K_ALIGN
    for scheme in ("full", "fewer"):
        x, y, _ = recorder.grids["emu_rebuild", scheme]
        threads = emu.DEFAULT_KNOBS["REBUILD_THREADS"]
        assert x == -(-n // threads) and 1 <= y < m and x * y <= emu.GRID_WAVES * (2048 // threads) * SMS + x
        for side, lines in (("a", m), ("b", n)):
            x, y, _ = recorder.grids[f"emu_split_{side}", scheme]
            block_lines, block_k = emu.SPLIT_BLOCK[side == "a"]  # nn: A's rows run along memory, B's columns across it
            assert x == -(-kp // block_k) and 1 <= y < -(-lines // block_lines)
            assert x * y <= emu.GRID_WAVES * emu.DEFAULT_KNOBS["SPLIT_BLOCKS_PER_SM"] * SMS + x


@pytest.mark.parametrize("dtype", emu.EMULATED_DTYPES)
def test_a_call_enqueues_both_schemes_the_skippable_products_and_the_sampled_magnitudes(dtype, monkeypatch):
    launches, (m, n, k) = _enqueued(monkeypatch, dtype, generated=True)
    s = emu.scheme(dtype, k)
    f = emu.fewer(s)
    names = [(launch[0], launch[1]) for launch in launches]
    kernels_named = [x for x in names if x[0].startswith("emu_")]
    assert kernels_named == [("emu_stats_a", "full"), ("emu_stats_b", "full"), ("emu_choose", "full"),
                             ("emu_split_a", "full"), ("emu_split_b", "full"), ("emu_split_a", "fewer"),
                             ("emu_split_b", "fewer"), ("emu_sample", "full"), ("emu_sample", "full"),
                             ("emu_rebuild", "full"), ("emu_rebuild", "fewer"), ("emu_fixup", "full"),
                             ("emu_fixup", "fewer")]
    choose = next(x for x in launches if x[0] == "emu_choose")
    words = choose[-1]  # emu_choose(peaks, K, choice): the stream's first word
    products = [x for x in launches if x[0].startswith("product")]
    kp = -(-k // 16) * 16
    # the residues' products, the last of them (the modulus the fewer scheme leaves out) stoppable by the choice
    assert [x[0] for x in products[:s.count]] == ["product"] * f.count + ["product unless"]
    n_p = -(-n // 16) * 16  # the products' N: their rows aligned
    assert n % 16 and products[s.count - 1][-1] == words and all(x[1] == (m, n_p, kp) for x in products[:s.count])
    # B's planes n_p lines apart (the split's plane_lines); the rebuild and the fix-up read rows n_p apart
    # (launches: name, scheme, then the kernel's arguments)
    assert all(x[4] == n and x[7] == n_p for x in launches if x[0] == "emu_split_b")
    assert all(x[4] == m and x[7] == m for x in launches if x[0] == "emu_split_a")
    assert all(x[5:8] == (m, n, n_p) for x in launches if x[0] == "emu_rebuild")
    assert all(x[9:12] == (m, n, n_p) for x in launches if x[0] == "emu_fixup")
    # the sampled magnitudes' quarter-sized product, then, after the rebuild, the full one, stoppable by the guard
    assert products[s.count][0] == "product" and products[s.count][1] == (m, n_p, -(-(kp // 4) // 16) * 16)
    assert products[s.count + 1][0] == "product unless" and products[s.count + 1][-1] == words + 4
    order = [x[0] for x in launches]
    assert order.index("emu_rebuild") < launches.index(products[s.count + 1]) < order.index("emu_fixup")
    # the gated kernels read the choice word; the fix-up counts again (its last argument)
    assert all(x[-1] == words for x in launches if x[0] in ("emu_split_a", "emu_split_b"))
    assert all(x[-2:] == (words, words + 4) for x in launches if x[0] == "emu_rebuild")
    assert all(x[-2:] == (words, 1) for x in launches if x[0] == "emu_fixup")


def test_a_call_without_the_choices_or_a_stoppable_kernel_enqueues_every_product(monkeypatch):
    dtype = "float64"
    s = emu.scheme(dtype, 8192)
    for generated, switches in ((True, {"fewer_moduli": False, "sampled_magnitudes": False}), (False, {})):
        launches, _ = _enqueued(monkeypatch, dtype, generated, **switches)
        names = [x[0] for x in launches]
        assert "emu_sample" not in names and ("emu_choose" in names) == (switches == {})
        products = [x for x in launches if x[0].startswith("product")]
        assert [x[0] for x in products] == ["product"] * (s.count + 1)  # every modulus and the full magnitudes
        assert all(x[-1] == 0 for x in launches if x[0] == "emu_fixup")  # no recount
