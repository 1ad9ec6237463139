"""The element types autotile computes in: one record per dtype, the one place each fact about it lives.

float32 and float64 are IEEE types that every kernel family computes in. bfloat16 and float16 are the
types models run in: the tensor cores multiply them and sum in float32, and the output is rounded to the
input's type (PyTorch's and cuBLAS's contract). NumPy has no bfloat16 and CuPy none either, so on the host
and in CuPy a bfloat16 matrix is held as its raw 16-bit patterns (`storage` "uint16"); torch tensors carry
the type itself. int8 is quantized inference's type: the tensor cores sum its products exactly in int32, and
the output is int32 (torch._int_mm's contract): `output` names the output's type where it is not the
input's. The 8-bit floats (float8_e4m3fn, float8_e5m2; torch's names) follow torch._scaled_mm: each operand
comes with a float32 scale (a one-element device array), the tensor cores sum the products in float32, and
C = (scale_a scale_b) sum, rounded once to bfloat16. Neither NumPy nor CuPy has them: both hold them as
their raw bytes (`storage` "uint8"), which only the dtype's name tells apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from autotile.errors import InvalidValueError


@dataclasses.dataclass(frozen=True)
class Dtype:
    """One element type. `size` in bytes; `ctype` the kernels' C type (16-bit types travel as raw
    `unsigned short`: the tensor cores read them from shared memory, and the kernels convert only in their
    epilogue, with PTX, so no CUDA header is needed); `storage` the NumPy/CuPy dtype that holds the values;
    `eps` the type's machine epsilon (2^-(mantissa bits); 0 for an integer type, whose products and sums
    are exact); `accumulator` the type its sums are kept in; `output` the type of the result (the input's
    own where empty); `cublas_aligned_rows` the matrices ("a", "b", "c") whose rows cuBLAS's GEMMs of the
    type run several times slower where they do not start 16-byte aligned."""

    name: str
    size: int
    ctype: str
    storage: str
    eps: float
    accumulator: str
    max_finite: float
    output: str = ""
    scaled: bool = False  # the operands come with a float32 scale each (torch._scaled_mm's contract)
    cublas_aligned_rows: tuple[str, ...] = ()

    @property
    def output_name(self) -> str:
        """The result's dtype: int8's products come out as int32, every other type's as itself."""
        return self.output or self.name

    @property
    def k_major_only(self) -> bool:
        """An 8-bit type: wgmma reads its operands K-major only, so its kernels differ by layout (a tile
        stored M- or N-contiguous is transposed on its way to the tensor cores)."""
        return self.size == 1

    @property
    def is_ieee_wide(self) -> bool:
        """float32 or float64: every kernel family (SIMT, tensor-core splits, DMMA) computes in it."""
        return self.name in ("float32", "float64")


# cuBLAS through torch 2.11 (H100 and H200, 2026-11-25 to 28): bfloat16 and float16 at 80-300 TFLOP/s where
# A's, B's or C's rows do not start 16-byte aligned, against 600-800 aligned (the shape databases: a median of
# 127 against 726 TFLOP/s on single matrices of 2^34 flops and more, 92 against 383 on batches); int8 where A's
# or B's do not, up to 3x slower (3120x568x6776: 133 us, 40 on the shape padded). float32's SGEMM runs them at
# the aligned speed.
_SIXTEEN_BIT_CUBLAS_ROWS = ("a", "b", "c")
DTYPES: dict[str, Dtype] = {
    "float32": Dtype("float32", 4, "float", "float32", 2.0**-23, "float32", 3.4028234663852886e38),
    "float64": Dtype("float64", 8, "double", "float64", 2.0**-52, "float64", 1.7976931348623157e308),
    "bfloat16": Dtype("bfloat16", 2, "unsigned short", "uint16", 2.0**-7, "float32", 3.3895313892515355e38,
                      cublas_aligned_rows=_SIXTEEN_BIT_CUBLAS_ROWS),
    "float16": Dtype("float16", 2, "unsigned short", "float16", 2.0**-10, "float32", 65504.0,
                     cublas_aligned_rows=_SIXTEEN_BIT_CUBLAS_ROWS),
    # Raw bytes in the kernels, as the 16-bit types: only the tensor cores read them as numbers.
    "int8": Dtype("int8", 1, "unsigned char", "int8", 0.0, "int32", 127.0, output="int32",
                  cublas_aligned_rows=("a", "b")),
    # 4 exponent bits (bias 7), 3 mantissa bits, no infinities, one NaN pattern per sign (S.1111.111)
    "float8_e4m3fn": Dtype("float8_e4m3fn", 1, "unsigned char", "uint8", 2.0**-3, "float32", 448.0,
                           output="bfloat16", scaled=True),
    # 5 exponent bits (bias 15), 2 mantissa bits: the top byte of a float16, infinities and NaNs as IEEE's
    "float8_e5m2": Dtype("float8_e5m2", 1, "unsigned char", "uint8", 2.0**-2, "float32", 57344.0,
                         output="bfloat16", scaled=True),
}
# Output types that are no input's (int8's int32): their storage and C type.
_OUTPUT_ONLY = {"int32": ("int32", "int")}
DTYPE_NAMES = tuple(DTYPES)
DTYPE_SIZES = {name: d.size for name, d in DTYPES.items()}
# The 16-bit float types of the models' matmuls (float32 sums, cuBLAS through GemmEx).
HALF_DTYPES = ("bfloat16", "float16")
# The 8-bit floats (torch._scaled_mm's contract: scaled operands, float32 sums, a bfloat16 C).
FLOAT8_DTYPES = tuple(name for name, d in DTYPES.items() if d.scaled)
# The types the tensor cores take as they are (MATH=wgmma_direct): the 16-bit floats, int8 and the 8-bit floats.
TENSOR_CORE_DTYPES = (*HALF_DTYPES, "int8", *FLOAT8_DTYPES)


def get(name: str) -> Dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise InvalidValueError(f"dtype {name!r} is not supported; choose one of {list(DTYPES)}") from None


def main_layout(name: str) -> str:
    """The matmul layout whose kernels are a dtype's fastest: nn (surveyed in full and lent to the other
    layouts), or nt for an 8-bit type (wgmma reads 8-bit operands K-major only, so nt's copies go straight
    to the tensor cores and every other layout's are transposed on the way; `dispatch.select` says which
    layouts lend to which)."""
    return "nt" if get(name).k_major_only else "nn"


def output_storage(name: str) -> str:
    """The NumPy/CuPy dtype that holds `name`'s results (int8: int32; bfloat16: its uint16 patterns)."""
    output = get(name).output_name
    return _OUTPUT_ONLY[output][0] if output in _OUTPUT_ONLY else DTYPES[output].storage


def itemsize(storage: str) -> int:
    """Bytes per element of an input's or an output's type (by name: "int32" as well as the DTYPES)."""
    if storage in _OUTPUT_ONLY:
        return int(np.dtype(_OUTPUT_ONLY[storage][0]).itemsize)
    return get(storage).size


def ctype(name: str) -> str:
    """The kernels' C type of an input's or an output's type (by name: "int32" as well as the DTYPES)."""
    return _OUTPUT_ONLY[name][1] if name in _OUTPUT_ONLY else get(name).ctype


def output_ctype(name: str) -> str:
    """The kernels' C type of `name`'s results."""
    output = get(name).output_name
    return _OUTPUT_ONLY[output][1] if output in _OUTPUT_ONLY else DTYPES[output].ctype


def from_float32(values: Any, dtype: str) -> Any:
    """`values` (a float32 NumPy or CuPy array) rounded to `dtype` to nearest, ties to even, as `dtype`'s
    storage: bfloat16 as its 16-bit patterns (the top half of the float32, rounded; a NaN stays a NaN);
    int8 rounded and clipped to [-128, 127]; an 8-bit float as its byte (past the largest finite value by
    more than half a step: NaN for float8_e4m3fn, which has no infinity, infinity for float8_e5m2)."""
    if dtype in FLOAT8_DTYPES:
        return _float8_from_float32(values, dtype)
    if dtype == "int8":
        xp = _array_module(values)
        return xp.clip(xp.rint(values), -128, 127).astype(xp.int8)
    if dtype != "bfloat16":
        return values.astype(get(dtype).storage)
    xp = _array_module(values)
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) >> 16
    is_nan = (bits & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return xp.where(is_nan, xp.uint32(0x7FC0), rounded).astype(xp.uint16)


def to_float32(values: Any, dtype: str) -> Any:
    """`values` held as `dtype`'s storage, widened exactly to float32 (NumPy or CuPy)."""
    if dtype in FLOAT8_DTYPES:
        xp = _array_module(values)
        return xp.asarray(float8_values(dtype))[xp.asarray(values).astype(xp.int32)]
    if dtype != "bfloat16":
        return values.astype("float32")
    xp = _array_module(values)
    return (xp.ascontiguousarray(values).astype(xp.uint32) << 16).view(xp.float32)


def float8_values(dtype: str) -> np.ndarray:
    """The float32 value of each of the 256 bytes of an 8-bit float (NaN for its NaN patterns)."""
    exponent_bits, bias = (4, 7) if dtype == "float8_e4m3fn" else (5, 15)
    mantissa_bits = 7 - exponent_bits
    codes = np.arange(256)
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = (codes & ((1 << mantissa_bits) - 1)).astype(np.float64) / (1 << mantissa_bits)
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** (1 - bias), (1 + mantissa) * 2.0 ** (exponent - bias))
    top = exponent == (1 << exponent_bits) - 1
    if dtype == "float8_e4m3fn":  # S.1111.111 is NaN; the rest of the top binade is finite
        magnitude = np.where(top & ((codes & 7) == 7), np.nan, magnitude)
    else:  # IEEE: the top binade is infinity (mantissa 0) or NaN
        magnitude = np.where(top, np.where((codes & 3) == 0, np.inf, np.nan), magnitude)
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


def _float8_from_float32(values: Any, dtype: str) -> Any:
    xp = _array_module(values)
    table = float8_values(dtype)[:128]
    finite = xp.asarray(table[np.isfinite(table)].astype(np.float64))  # codes 0, 1, ...: increasing values
    v = xp.asarray(values, dtype=xp.float64)
    magnitude = xp.abs(v)
    above = xp.clip(xp.searchsorted(finite, magnitude), 1, len(finite) - 1)
    low, high = finite[above - 1], finite[above]
    # nearest; a tie goes to the even code (the one whose last mantissa bit is 0)
    code = xp.where((magnitude - low < high - magnitude) | ((magnitude - low == high - magnitude) & (above % 2 == 1)),
                    above - 1, above)
    largest, step = float(finite[-1]), float(finite[-1] - finite[-2])
    overflow = 0x7F if dtype == "float8_e4m3fn" else 0x7C  # NaN / infinity
    code = xp.where(magnitude > largest + step / 2, overflow, code)
    code = xp.where(xp.isnan(v), 0x7F, code)
    return (code | xp.where(xp.signbit(v), 0x80, 0)).astype(xp.uint8)


def _array_module(values: Any) -> Any:
    if isinstance(values, np.ndarray):
        return np
    import cupy

    return cupy


__all__ = ["DTYPES", "DTYPE_NAMES", "DTYPE_SIZES", "Dtype", "FLOAT8_DTYPES", "HALF_DTYPES", "TENSOR_CORE_DTYPES",
           "float8_values", "from_float32", "get",
           "ctype", "itemsize", "main_layout", "output_ctype", "output_storage", "to_float32"]
