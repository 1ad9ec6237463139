"""The element types autotile computes in: one record per dtype, the one place each fact about it lives.

float32 and float64 are IEEE types that every kernel family computes in. bfloat16 and float16 are the
types models run in: the tensor cores multiply them and sum in float32, and the output is rounded to the
input's type (PyTorch's and cuBLAS's contract). NumPy has no bfloat16 and CuPy none either, so on the host
and in CuPy a bfloat16 matrix is held as its raw 16-bit patterns (`storage` "uint16"); torch tensors carry
the type itself. int8 is quantized inference's type: the tensor cores sum its products exactly in int32, and
the output is int32 (torch._int_mm's contract): `output` names the output's type where it is not the
input's.
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
    own where empty)."""

    name: str
    size: int
    ctype: str
    storage: str
    eps: float
    accumulator: str
    max_finite: float
    output: str = ""

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


DTYPES: dict[str, Dtype] = {
    "float32": Dtype("float32", 4, "float", "float32", 2.0**-23, "float32", 3.4028234663852886e38),
    "float64": Dtype("float64", 8, "double", "float64", 2.0**-52, "float64", 1.7976931348623157e308),
    "bfloat16": Dtype("bfloat16", 2, "unsigned short", "uint16", 2.0**-7, "float32", 3.3895313892515355e38),
    "float16": Dtype("float16", 2, "unsigned short", "float16", 2.0**-10, "float32", 65504.0),
    # Raw bytes in the kernels, as the 16-bit types: only the tensor cores read them as numbers.
    "int8": Dtype("int8", 1, "unsigned char", "int8", 0.0, "int32", 127.0, output="int32"),
}
# Output types that are no input's (int8's int32): their storage and C type.
_OUTPUT_ONLY = {"int32": ("int32", "int")}
DTYPE_NAMES = tuple(DTYPES)
DTYPE_SIZES = {name: d.size for name, d in DTYPES.items()}
# The 16-bit float types of the models' matmuls (float32 sums, cuBLAS through GemmEx).
HALF_DTYPES = ("bfloat16", "float16")
# The types the tensor cores take as they are (MATH=wgmma_direct): the 16-bit floats and int8.
TENSOR_CORE_DTYPES = (*HALF_DTYPES, "int8")


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


def output_ctype(name: str) -> str:
    """The kernels' C type of `name`'s results."""
    output = get(name).output_name
    return _OUTPUT_ONLY[output][1] if output in _OUTPUT_ONLY else DTYPES[output].ctype


def from_float32(values: Any, dtype: str) -> Any:
    """`values` (a float32 NumPy or CuPy array) rounded to `dtype` to nearest, ties to even, as `dtype`'s
    storage: bfloat16 as its 16-bit patterns (the top half of the float32, rounded; a NaN stays a NaN);
    int8 rounded and clipped to [-128, 127]."""
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
    if dtype != "bfloat16":
        return values.astype("float32")
    xp = _array_module(values)
    return (xp.ascontiguousarray(values).astype(xp.uint32) << 16).view(xp.float32)


def _array_module(values: Any) -> Any:
    if isinstance(values, np.ndarray):
        return np
    import cupy

    return cupy


__all__ = ["DTYPES", "DTYPE_NAMES", "DTYPE_SIZES", "Dtype", "HALF_DTYPES", "TENSOR_CORE_DTYPES", "from_float32", "get",
           "itemsize", "main_layout", "output_ctype", "output_storage", "to_float32"]
