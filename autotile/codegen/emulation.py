"""float64 and float32 matmul emulated on the int8 tensor cores (Ozaki scheme II): the arithmetic, and the
CUDA source of its kernels.

The scheme, for C = A B with A M x K and B K x N:

1. Scale. Row i of A gets the exponent e_i (max_k |a_ik| < 2^e_i) and a gain g_i >= 0 (`line_gain`, from
   the row's peak p_i: how far 2^e_i stands above its mean magnitude, `line_peak`) and becomes the integers
   a'_ik = rint(a_ik 2^(beta + g_i - e_i)), |a'_ik| <= 2^(beta + g_i); column j of B likewise with f_j, h_j.
   The product S = A' B' still has |S_ij| <= K 4^beta: where both gains are zero, as each |a'| |b'| <= 4^beta;
   else g_i + h_j <= p - 2, p the larger of the two lines' peaks (say the column's), and
   sum_k |a'_ik| |b'_kj| <= 2^(beta + g_i) (2^(beta + h_j) K 2^(1 - p) + K / 2) <= K 4^beta. A line whose
   values spread over many binades (a high peak) so keeps bits for its smaller values that the range of the
   moduli would otherwise leave unused.
2. Take residues. For each modulus m_l of `MODULI` (pairwise coprime, at most 256), a'_ik mod m_l in the
   symmetric range [-128, 127] is an int8; likewise for B'.
3. Multiply. Each pair of residue matrices goes through an int8 GEMM with exact int32 sums (|sum| <=
   K 128^2 < 2^31 for K <= `MAX_K`).
4. Rebuild. With M = prod m_l and `beta` chosen so that K 4^beta <= M / 4, the Chinese remainder theorem
   gives the one S_ij in (-M/2, M/2) with those residues: S = sum_l r_l w_l - q M, where
   w_l = (M/m_l) ((M/m_l)^-1 mod m_l) and q = round(sum_l r_l w_l / M). The kernel evaluates it exactly:
   each w_l and M cut into `LIMB_BITS`-bit limbs held as doubles (every partial sum an integer below 2^53),
   the limbs joined in 128-bit integers, then C_ij = S_ij 2^(e_i - g_i + f_j - h_j - 2 beta).

The error of the result comes from step 1 only (the rest is exact, up to the final rounding): each a_ik
moves by at most half a unit of 2^(e_i - g_i - beta). The template's `guard_ok` holds each element to its bound
on what that costs; a further int8 GEMM of the magnitudes (|a_ik| 2^(7 - t_i), rounded down and clipped at 127,
t_i such that the row's mean magnitude lands in [16, 32)) gives a lower bound on (|A| |B|)_ij, and an element
whose bound is not below a native GEMM's worst case, K u (|A||B|)_ij, or whose row or column holds a NaN or an
infinity, is recomputed natively (its run of 32, or its whole output tile).

Pure Python: importing this module imports nothing heavy (no CuPy).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
from collections.abc import Mapping
from typing import Any

from autotile.codegen.dtypes import DTYPES
from autotile.errors import InvalidValueError

# Pairwise coprime moduli no larger than 256, largest first: 256 = 2^8, 255 = 3 5 17, 253 = 11 23,
# 247 = 13 19, 217 = 7 31, the rest prime. 16 of them multiply to 2^125.4: the rebuilt integers and their
# sums stay inside a signed 128-bit integer (the kernel's), which caps the count at 16.
MODULI: tuple[int, ...] = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211, 199, 197, 193)
# int8 residues in [-128, 127]: an int32 sum of K products stays exact while K 128^2 < 2^31.
MAX_K = (2**31 - 1) // (128 * 128)
# Bits per limb of the rebuilding constants: a limb times a residue (|r| <= 128) summed over 16 moduli, and
# q M's limb (|q| <= 16 * 128), stay below 2^53, so every partial sum is an exact double.
LIMB_BITS = 41
# The magnitudes' int8 matrix: |x| 2^(7 - e) rounded down, in [0, 127].
MAGNITUDE_BITS = 7
# Mantissa bits (with the implicit one) of the types emulated: the unit roundoff the guard's bound is in.
MANTISSA_BITS = {"float64": 53, "float32": 24}
EMULATED_DTYPES = tuple(MANTISSA_BITS)
# The bits each scaled operand keeps at least, by default: float64's mantissa (16 moduli up to K = 2^17);
# float32's mantissa plus two (9 moduli, beta 27-28 up to K = 16384), because at beta 24 (8 moduli) the
# guard could not vouch for 0.45 % of the elements of an 8192^3 product whose rows spread over tens of
# binades, and recomputing them natively made that product 2.6x slower than SGEMM (H100, 2026-11-25),
# where 9 moduli cost 7 % on every product and leave none to recompute.
DEFAULT_BITS = {"float64": 53, "float32": 26}
# Where the inputs allow it, one modulus fewer: a call's statistics kernels measure each line's peak (how far
# its largest magnitude, rounded up to a power of two, stands above its mean magnitude) and `emu_choose`
# takes the scheme of one modulus fewer where those peaks say the guard would pass every element of its
# product with 2^PEAK_MARGIN_BITS to spare (`chooses_fewer`); the guard still checks every element, and the
# native fix-up recomputes any it cannot vouch for. Normal inputs have peaks of 3-4 (2^13 elements); lines
# whose values spread over many binades have far larger ones, and keep every modulus. The scheme of fewer
# moduli must keep at least LEAST_BITS (on an H200, 2026-11-28, `bench-emulation --bits`: float64 8192³ with 15
# moduli, beta 51, 15.7-15.8 ms against 16.8 with 16, error 1.1e-15 against DGEMM's 2.6e-15; float32 with 8,
# beta 24, 8.94 ms against 9.70, error 1.4e-7 against SGEMM's 1.6e-6).
LEAST_BITS = {"float64": 50, "float32": 23}
PEAK_MARGIN_BITS = 4
# Output tiles the guard flags and the native fix-up recomputes (rows x columns).
FIX_TILE = 64


def _product(moduli: tuple[int, ...]) -> int:
    return math.prod(moduli)


def max_beta(k: int, count: int) -> int:
    """The most bits `beta` the scaled operands may have for a K of `k` with the first `count` moduli:
    the largest beta with k 4^beta <= M / 4, so that q (step 4) rounds far from a half."""
    m = _product(MODULI[:count])
    beta = 0
    while k * 4 ** (beta + 1) * 4 <= m:
        beta += 1
    return beta


@dataclasses.dataclass(frozen=True)
class Scheme:
    """One emulation: its moduli and the bits each scaled operand keeps (`beta`), for one K."""

    dtype: str
    k: int
    moduli: tuple[int, ...]
    beta: int

    @property
    def count(self) -> int:
        """Residue products (int8 GEMMs) per matmul, the magnitudes' product not counted."""
        return len(self.moduli)

    @property
    def modulus_product(self) -> int:
        return _product(self.moduli)

    @property
    def limbs(self) -> int:
        """Limbs of LIMB_BITS bits that hold M and every w_l."""
        return -(-self.modulus_product.bit_length() // LIMB_BITS)

    def weights(self) -> list[int]:
        """w_l = (M / m_l) ((M / m_l)^-1 mod m_l): S = sum_l r_l w_l (mod M)."""
        total = self.modulus_product
        return [(total // m) * pow(total // m, -1, m) for m in self.moduli]

    def limbs_of(self, value: int) -> list[int]:
        """`value` (>= 0) in base 2^LIMB_BITS, least significant limb first, `limbs` of them."""
        mask = (1 << LIMB_BITS) - 1
        return [(value >> (LIMB_BITS * t)) & mask for t in range(self.limbs)]

    def unit_roundoff(self) -> float:
        """u of the emulated type: 2^-53 for float64, 2^-24 for float32."""
        return 2.0 ** -MANTISSA_BITS[self.dtype]


def fewer(s: Scheme) -> Scheme | None:
    """The scheme of one modulus fewer than `s` for the same K (its beta the most that allows), or None where
    that keeps fewer than `LEAST_BITS` bits."""
    if s.count < 2:
        return None
    beta = max_beta(s.k, s.count - 1)
    return Scheme(s.dtype, s.k, s.moduli[:-1], beta) if beta >= LEAST_BITS[s.dtype] else None


def fewer_exponent(f: Scheme) -> int:
    """`emu_choose`'s threshold: the scheme of fewer moduli `f` runs where 2^peak_a + 2^peak_b <= K 2^this.
    Why: with S_a, S_b the sums of a row's and a column's magnitudes in units of their scales 2^e (so that a
    peak is log2(K / S)), the guard's bound 2^-(beta+1) (S_a + S_b) is under K u S_a S_b / K, what (|A||B|)_ij
    would be were it the product of the two lines' mean magnitudes, K times over, exactly where
    2^peak_a + 2^peak_b <= K u 2^(beta+1); PEAK_MARGIN_BITS to spare."""
    return f.beta + 1 - MANTISSA_BITS[f.dtype] - PEAK_MARGIN_BITS


def chooses_fewer(f: Scheme, k: int, peak_a: int, peak_b: int) -> bool:
    """What `emu_choose` decides for the scheme of fewer moduli `f`, a K of `k` and the largest line peaks of A
    and B (the arithmetic of the kernel, in Python)."""
    return 2.0**peak_a + 2.0**peak_b <= math.ldexp(float(k), fewer_exponent(f))


def line_peak(values: list[float]) -> int:
    """A line's peak as the statistics kernels compute it: the exponent above K 2^e / sum |x|, 2^e the power of
    two above its largest magnitude (a line of nonzero finite values; the kernels' sum is rounded up)."""
    largest = max(abs(v) for v in values)
    e = math.frexp(largest)[1]
    scaled_sum = math.fsum(abs(v) for v in values) / 2.0**e
    return math.frexp(len(values) / scaled_sum)[1]


def line_gain(peak: int, cap: int) -> int:
    """The bits beyond beta a line of peak `peak` (`line_peak`) keeps, at most `cap` (`gain_cap`): its
    exponent is lowered by that much (step 1 of the module's docstring says why the rebuild's range holds).
    Normal lines (peaks 3-4 at K = 8192) gain 0 or 1 bit; a line whose largest value stands 2^20 above its
    mean, about 10."""
    return max(0, min(cap, (peak - 2) // 2))


# The largest scaled value, as a power of two, whose residues the split kernels compute exactly (the
# template's `residues_into`): in doubles v = vh 2^26 + vl, vh (2^26 mod m) + vl below 2^44,
# far inside the 2^51 that the rounding trick holds (and q = rint(y / m) moves by at most 2^-17 before it is
# rounded, against the 1 / (2 m) that separates y / m from a half); in floats the trick's 2^22 caps v at 2^28.
SPLIT_LIMIT_BITS = {"double": 62, "float": 28}


def gain_cap(full: Scheme) -> int:
    """The most bits beyond beta any line may keep in a call that runs `full` or its scheme of one modulus
    fewer (both read the same statistics): what both schemes' split kernels hold."""
    schemes = [full] + [f for f in (fewer(full),) if f is not None]
    return max(0, min(SPLIT_LIMIT_BITS[residue_real(x)] - x.beta for x in schemes))


def scheme(dtype: str, k: int, bits: int | None = None) -> Scheme:
    """The fewest moduli that let each scaled operand keep at least `bits` bits (default: `DEFAULT_BITS`,
    53 for float64, 26 for float32) for a K of `k`. Raises `InvalidValueError` for a dtype that is not emulated, a K
    beyond `MAX_K`, or bits no 16 moduli reach."""
    if dtype not in MANTISSA_BITS:
        raise InvalidValueError(f"emulation computes {' and '.join(EMULATED_DTYPES)}; got {dtype}")
    if not 1 <= k <= MAX_K:
        raise InvalidValueError(f"K {k} is outside 1..{MAX_K} (int8 products summed exactly in int32)")
    want = DEFAULT_BITS[dtype] if bits is None else bits
    for count in range(1, len(MODULI) + 1):
        beta = max_beta(k, count)
        if beta >= want:
            return Scheme(dtype, k, MODULI[:count], beta)
    raise InvalidValueError(f"{want} bits per operand at K {k} need more than {len(MODULI)} moduli "
                            f"(at most {max_beta(k, len(MODULI))} bits)")


# --- the arithmetic, on Python integers (what the kernels compute, for the tests and the docs) -----------


def symmetric_residue(value: int, modulus: int) -> int:
    """`value` mod `modulus` in [-(modulus // 2), (modulus - 1) // 2]: an int8 for moduli up to 256."""
    r = value % modulus
    return r - modulus if r >= (modulus + 1) // 2 else r


def rebuild(residues: list[int], s: Scheme) -> int:
    """The integer in (-M/2, M/2) with the given residues, as the kernel computes it: limbs of the weights
    times the residues summed in exact doubles, q from sum r_l (w_l / M) in doubles, limbs joined."""
    weights = s.weights()
    total = s.modulus_product
    fractions = [w / total for w in weights]  # what the kernel holds: each w_l / M rounded to a double
    # The kernel uses FMAs; here a product and a sum, each rounded: q's estimate moves by far less than the
    # quarter that separates it from a half, and every limb's products and sums are exact either way.
    q_estimate = 0.0
    for r, f in zip(residues, fractions, strict=True):
        q_estimate += float(r) * f
    q = round(q_estimate)
    limbs = [0.0] * s.limbs
    weight_limbs = [s.limbs_of(w) for w in weights]
    for r, wl in zip(residues, weight_limbs, strict=True):
        for t in range(s.limbs):
            limbs[t] += float(r) * float(wl[t])
    for t, mt in enumerate(s.limbs_of(total)):
        limbs[t] += float(-q) * float(mt)
    value = 0
    for t in reversed(range(s.limbs)):  # exact integers below 2^53: the join is exact
        assert limbs[t] == int(limbs[t]) and abs(limbs[t]) < 2.0**53
        value = (value << LIMB_BITS) + int(limbs[t])
    # the kernel joins modulo 2^128 and reads the result as signed: the same value while |S| < 2^127
    return value


# --- the CUDA source --------------------------------------------------------------------------------------

TEMPLATE = "emulation.cu.j2"
# Extra NVRTC option: the rebuild joins its limbs in 128-bit integers.
EXTRA_OPTIONS: tuple[str, ...] = ("--device-int128",)
# Launch shapes (threads per block) of the elementwise kernels: the template's knobs, with their defaults.
# STATS_WARPS: warps per block of the statistics of lines that run along memory (a warp per line);
# STATS_COLUMN_WARPS: of lines across memory (a thread per line, the warps dividing its length).
# FEW_PER_TILE: the most runs of 32 elements of a row holding failed elements that the fix-up recomputes
# alone in an output tile (of its 128) rather than the whole tile; an eighth of it where A's rows and B's
# columns both run along K (each failed element then costs a warp's pass over K, not a lane's).
# REBUILD_ROWS: rows of its column each thread of the rebuild takes at a time (2 ran slower than 1 on an H200,
# 2026-11-28: twice the registers, a third of the warps).
# SPLIT_BLOCKS_PER_SM: the split kernels' resident blocks per SM (their __launch_bounds__: at 3, 80 registers).
DEFAULT_KNOBS: dict[str, int] = {"STATS_WARPS": 8, "STATS_COLUMN_WARPS": 32, "REBUILD_THREADS": 256,
                                 "REBUILD_ROWS": 1, "FEW_PER_TILE": 16, "SPLIT_BLOCKS_PER_SM": 3}
# The split kernels' blocks (256 threads), as (lines, elements of K) each takes: where an operand's lines run
# along memory, a warp per line and four elements per lane; where they run across it, a lane per line and
# four elements per warp.
SPLIT_THREADS = 256
SPLIT_BLOCK = {True: (8, 128), False: (32, 32)}


# The split and rebuild kernels' grids stop at GRID_WAVES waves of resident blocks, their blocks looping over
# the rest of the lines (rows): where a call may choose one modulus fewer, both schemes' kernels are launched
# and the one not chosen returns block by block. Uncapped, at 8192 x 8192 that did-nothing rebuild (262144
# blocks) took 160 us and each did-nothing split kernel (65536) 42 us (H100, Nsight Compute, 2026-12-06): 0.26
# ms of a 15.3 ms float64 call.
GRID_WAVES = 2


def capped_rows(columns: int, rows: int, blocks_per_sm: int, sm_count: int) -> int:
    """A grid's y extent for `columns` blocks along x and `rows` blocks of work along y: at most GRID_WAVES
    waves of `blocks_per_sm` blocks on each of `sm_count` SMs (and CUDA's 65535), at least one."""
    waves = -(-GRID_WAVES * blocks_per_sm * sm_count // columns)
    return max(1, min(rows, waves, 65535))


def split_grid(lines: int, kp: int, contiguous: bool, knobs: Mapping[str, int], sm_count: int) -> tuple[int, int, int]:
    """The grid of a split kernel over `lines` lines of `kp` elements (`contiguous`: lines run along memory)
    on a GPU of `sm_count` SMs; the kernel loops over the lines its grid does not reach."""
    block_lines, block_k = SPLIT_BLOCK[contiguous]
    columns = -(-kp // block_k)
    return (columns, capped_rows(columns, -(-lines // block_lines), knobs["SPLIT_BLOCKS_PER_SM"], sm_count), 1)


def rebuild_grid(m: int, n: int, knobs: Mapping[str, int], sm_count: int) -> tuple[int, int, int]:
    """The rebuild's grid over the M x N output (a thread per column, REBUILD_ROWS rows at a time) on a GPU of
    `sm_count` SMs (its few registers let a full SM's threads run); its blocks loop over the rows the grid
    does not reach."""
    threads, rows = knobs["REBUILD_THREADS"], knobs["REBUILD_ROWS"]
    columns = -(-n // threads)
    return (columns, capped_rows(columns, -(-m // rows), 2048 // threads, sm_count), 1)


def split_bits(s: Scheme) -> int:
    """Where the split kernels cut each scaled value v = vh 2^bits + vl before taking residues (see the
    template): 26 in doubles, 14 in floats, so that vh (2^bits mod m) + vl stays far inside the type's exact
    integers."""
    return 26 if residue_real(s) == "double" else 14


def residue_real(s: Scheme) -> str:
    """The C type the split kernels compute residues in: float where the scaled values fit its 24 bits plus
    the FMA's quotient range (float32 up to beta 28), else double."""
    return "double" if s.dtype == "float64" or s.beta > 28 else "float"
KERNEL_NAMES = ("emu_stats_a", "emu_stats_b", "emu_choose", "emu_split_a", "emu_split_b", "emu_sample",
                "emu_rebuild", "emu_rebuild_residues", "emu_fixup")


def _to_float32(value: float) -> float:
    """`value` rounded to the nearest float32."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _double_literal(value: float) -> str:
    """`value` exactly, as a C hexadecimal floating literal."""
    return float(value).hex()


@functools.lru_cache(maxsize=64)
def _render_cached(dtype: str, moduli: tuple[int, ...], beta: int, knob_items: tuple[tuple[str, int], ...],
                   contig_k_a: bool, contig_k_b: bool, full_count: int, full_beta: int,
                   fewer_exp: int | None, max_gain: int) -> str:
    from autotile.codegen.render import environment

    s = Scheme(dtype, 1, moduli, beta)
    total = s.modulus_product
    weights = s.weights()
    knobs = dict(knob_items)
    real = residue_real(s)
    split_limit = SPLIT_LIMIT_BITS[real]
    if real == "double":
        inv_moduli = [_double_literal(1.0 / m) for m in moduli]
    else:
        inv_moduli = [_double_literal(_to_float32(1.0 / m)) + "f" for m in moduli]
    return environment().get_template(TEMPLATE).render(
        ctype=DTYPES[dtype].ctype, dtype=dtype, moduli=list(moduli), count=len(moduli), beta=beta, real=real,
        inv_moduli=inv_moduli,
        split_bits=split_bits(s), split_residues=[symmetric_residue(2 ** split_bits(s), m) for m in moduli],
        bound_factor=_double_literal(2.0 ** -(beta + 1) * (1 + 2.0**-20)), limbs=s.limbs, limb_bits=LIMB_BITS,
        weight_limbs=[[f"{v}.0" for v in s.limbs_of(w)] for w in weights],
        weight_fractions=[_double_literal(w / total) for w in weights],
        modulus_limbs=[f"{v}.0" for v in s.limbs_of(total)],
        magnitude_bits=MAGNITUDE_BITS, fix_tile=FIX_TILE,
        unit_roundoff=_double_literal(s.unit_roundoff()), contig_k_a=contig_k_a, contig_k_b=contig_k_b,
        is_fewer=len(moduli) < full_count, mag_plane=full_count, bound_scale=_double_literal(2.0 ** (full_beta - beta)),
        fewer_exp=fewer_exp, peak_margin=PEAK_MARGIN_BITS, max_gain=max_gain, split_limit=split_limit,
        split_threads=SPLIT_THREADS, **knobs)


def render(s: Scheme, layout: str, knobs: Mapping[str, Any] | None = None, full: Scheme | None = None) -> str:
    """The CUDA source of every kernel of the scheme `s` for operands in `layout` ("nn", "nt", "tn", "tt":
    A row-major when its letter is "n", B row-major (K x N) when its letter is "n"). `full`: where `s` is the
    scheme of one modulus fewer (`fewer`) that a call may choose instead of `full`, the latter: `s` then reads
    the full scheme's statistics and writes its magnitudes where the full scheme does. Else `s` is a full
    scheme, whose `emu_choose` chooses between it and its `fewer` scheme, where it has one."""
    if layout not in ("nn", "nt", "tn", "tt"):
        raise InvalidValueError(f"layout {layout!r} is not one of nn, nt, tn, tt")
    merged = dict(DEFAULT_KNOBS)
    merged.update(knobs or {})
    unknown = set(merged) - set(DEFAULT_KNOBS)
    if unknown:
        raise InvalidValueError(f"unknown emulation knob(s) {', '.join(sorted(unknown))}; known: "
                                f"{', '.join(DEFAULT_KNOBS)}")
    # A's rows run along K when A is row-major; B's columns run along K when B is stored N x K ("t").
    if full is None:
        f = fewer(s)
        return _render_cached(s.dtype, s.moduli, s.beta, tuple(sorted(merged.items())), layout[0] == "n",
                              layout[1] == "t", s.count, s.beta, None if f is None else fewer_exponent(f), gain_cap(s))
    return _render_cached(s.dtype, s.moduli, s.beta, tuple(sorted(merged.items())), layout[0] == "n",
                          layout[1] == "t", full.count, full.beta, None, gain_cap(full))


__all__ = ["DEFAULT_BITS", "EMULATED_DTYPES", "EXTRA_OPTIONS", "FIX_TILE", "KERNEL_NAMES", "LEAST_BITS", "LIMB_BITS",
           "MAX_K", "MODULI", "PEAK_MARGIN_BITS", "SPLIT_LIMIT_BITS", "Scheme", "chooses_fewer", "fewer",
           "fewer_exponent", "gain_cap", "line_gain", "line_peak", "max_beta", "rebuild", "render", "scheme",
           "symmetric_residue"]
