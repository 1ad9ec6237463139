"""`ProblemKey`: what one call or one tuning run computes (kernel, dtype, layout, shape), as one value.

The same key names a tuning study, a cache entry and a library call, so the four facts travel together
and in one order everywhere. Shapes are checked once, here: positive integers that fit the generated
kernels' 32-bit indices.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Sequence

from autotile.codegen import dtypes as dtypes_mod
from autotile.codegen.dtypes import DTYPE_NAMES
from autotile.errors import InvalidValueError, UnknownNameError

# Each kernel's dimensions, in the order a shape lists them. bmm is matmul over a batch of matrices.
KERNEL_DIMS: dict[str, tuple[str, ...]] = {"matmul": ("M", "N", "K"), "bmm": ("batch", "M", "N", "K"),
                                           "matvec": ("M", "K")}
DTYPES = DTYPE_NAMES
# How each kernel's operands may be stored. matvec: A row- or column-major. matmul and bmm, in BLAS's
# words: the first letter for A, the second for B; "n" as written (A is M x K row-major, B is K x N
# row-major), "t" stored transposed (A as a K x M row-major array, B as N x K: PyTorch's `x @ W.T` is nt).
MATMUL_LAYOUTS = ("nn", "nt", "tn", "tt")
KERNEL_LAYOUTS: dict[str, tuple[str, ...]] = {"matmul": MATMUL_LAYOUTS, "bmm": MATMUL_LAYOUTS,
                                              "matvec": ("row", "col")}
LAYOUTS = ("row", "col", *MATMUL_LAYOUTS)
# Older names still accepted: matmul's only layout was "row" (both operands row-major) before nt, tn, tt.
LAYOUT_ALIASES: dict[str, dict[str, str]] = {"matmul": {"row": "nn"}, "bmm": {"row": "nn"}}
MAX_DIM = 2**31 - 1  # the kernels index with 32-bit ints
# The types a matvec computes in: int8 is quantized inference's matmul (int32 results), and the 8-bit floats
# come with scales (torch._scaled_mm's contract); neither has a matvec.
MATVEC_DTYPES = tuple(n for n in DTYPE_NAMES if n != "int8" and not dtypes_mod.get(n).scaled)


def as_matvec(kernel: str, dtype: str, layout: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, int], bool] | None:
    """A 2-D matmul of one row (M = 1) or one column (N = 1) as the matvec it is: (the matvec's layout, its
    (rows, K), whether the operands swap: B the matrix and A the vector); None for any other problem. The
    vector is one row or one column of a packed matrix, so of unit step, and C is y. A decode step's
    `x @ W.T` at one token is `W @ x`: the matvec kernels, tuned to read the matrix at full bandwidth, and
    cuBLAS's GEMV, rather than a GEMM's tiles and call."""
    if kernel != "matmul" or dtype not in MATVEC_DTYPES:
        return None
    M, N, K = shape
    if M == 1:  # C (1 x N) = a @ B, so y = B^T a: B^T (N x K) is row-major where B is column-major
        return ("row" if layout[1] == "t" else "col"), (N, K), True
    if N == 1:  # C (M x 1) = A @ b
        return ("row" if layout[0] == "n" else "col"), (M, K), False
    return None


_SEPARATORS = re.compile(r"[x×X,]")
_ASCII_DIGITS = re.compile(r"[0-9]+")


def _dims(kernel: str) -> tuple[str, ...]:
    try:
        return KERNEL_DIMS[kernel]
    except KeyError:
        raise UnknownNameError(f"unknown kernel {kernel!r}; kernels: {', '.join(KERNEL_DIMS)}") from None


def kernel_layouts(kernel: str) -> tuple[str, ...]:
    """The layouts `kernel` supports, the default first."""
    _dims(kernel)
    return KERNEL_LAYOUTS[kernel]


def canonical_layout(kernel: str, layout: str) -> str:
    """`layout` under its current name for `kernel` ("row" is matmul's old name for "nn"), checked."""
    layout = LAYOUT_ALIASES.get(kernel, {}).get(layout, layout)
    allowed = kernel_layouts(kernel)
    if layout not in allowed:
        raise InvalidValueError(f"{kernel} layout {layout!r} is not supported; choose one of {list(allowed)}")
    return layout


def layout_spellings(kernel: str, layout: str) -> tuple[str, ...]:
    """Every name `layout` has had for `kernel`, current first (where older files may be found under)."""
    return (layout, *(old for old, new in LAYOUT_ALIASES.get(kernel, {}).items() if new == layout))


def _check_dim(kernel: str, shape: object, value: int) -> int:
    if value < 1:
        raise InvalidValueError(f"{kernel} shape {shape}: every size must be at least 1, got {value}")
    if value > MAX_DIM:
        raise InvalidValueError(f"{kernel} shape {shape}: size {value} exceeds {MAX_DIM} (2**31 - 1), the "
                                "32-bit index range of the generated kernels")
    return value


def parse_shape(kernel: str, shape: str | Sequence[int]) -> tuple[int, ...]:
    """'4096x4096x4096' or (4096, 4096, 4096) -> (4096, 4096, 4096), checked: as many sizes as the kernel
    has dimensions, each an integer (no bool, no float, ASCII digits only) from 1 to 2**31 - 1."""
    dims = _dims(kernel)
    example = "x".join(["1024"] * len(dims))
    if isinstance(shape, str):
        parts = [p.strip() for p in _SEPARATORS.split(shape.strip())]
        # str.isdigit() accepts superscripts such as '²', which int() then rejects: ASCII digits only.
        if len(parts) != len(dims) or not all(_ASCII_DIGITS.fullmatch(p) for p in parts):
            raise InvalidValueError(f"{kernel} shape {shape!r} must be {'x'.join(dims)} with positive integers, "
                                    f"for example {example}")
        values: list[int] = [int(p) for p in parts]
    else:
        if isinstance(shape, (bytes, bytearray)) or not isinstance(shape, Sequence):
            raise InvalidValueError(f"{kernel} shape {shape!r} must be a string like {example} or a tuple of ints")
        values = []
        item: object
        for item in shape:
            # bool is an int subclass and a float would be truncated silently: both are mistakes.
            if isinstance(item, bool):
                raise InvalidValueError(f"{kernel} shape {tuple(shape)!r}: {item!r} is not a size")
            try:
                values.append(operator.index(item))  # type: ignore[arg-type]  # ints and NumPy ints, never floats
            except TypeError:
                raise InvalidValueError(f"{kernel} shape {tuple(shape)!r}: {item!r} is not an integer") from None
        if len(values) != len(dims):
            raise InvalidValueError(f"{kernel} shape {tuple(shape)!r} must have {len(dims)} sizes "
                                    f"({'x'.join(dims)})")
    text = shape if isinstance(shape, str) else tuple(values)
    return tuple(_check_dim(kernel, repr(text), v) for v in values)


@dataclasses.dataclass(frozen=True)
class ProblemKey:
    """One problem: a kernel, its element type, the storage order of its operands (`KERNEL_LAYOUTS`), and
    the shape (MxNxK, batchxMxNxK or MxK)."""

    kernel: str
    dtype: str
    layout: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        _dims(self.kernel)
        if self.dtype not in DTYPES:
            raise InvalidValueError(f"dtype {self.dtype!r} is not supported; choose one of {list(DTYPES)}")
        object.__setattr__(self, "layout", canonical_layout(self.kernel, self.layout))
        object.__setattr__(self, "shape", parse_shape(self.kernel, self.shape))

    @classmethod
    def of(cls, kernel: str, shape: str | Sequence[int], dtype: str = "float32", layout: str | None = None
           ) -> ProblemKey:
        """A key from user input: the shape may be text ('4096x4096x4096') or a sequence; layout None is
        the kernel's first (nn, row)."""
        return cls(kernel, dtype, layout or kernel_layouts(kernel)[0], parse_shape(kernel, shape))

    @property
    def shape_text(self) -> str:
        """'4096x4096x4096'."""
        return "x".join(map(str, self.shape))

    def with_shape(self, shape: Sequence[int]) -> ProblemKey:
        return dataclasses.replace(self, shape=tuple(shape))

    def __str__(self) -> str:
        return f"{self.kernel} {self.dtype} {self.layout} {self.shape_text}"

    def to_json(self) -> dict[str, object]:
        return {"kernel": self.kernel, "dtype": self.dtype, "layout": self.layout, "shape": list(self.shape)}
