"""The padded plan's shapes and copy kernels: a matmul whose operands' rows do not start 16-byte aligned
computed on zero-padded copies whose rows do (`autotile.library.padding` runs it).

Each operand is padded along its contiguous dimension (K for A row-major and for B stored N x K, M for A
stored K x M, N for B row-major) to a multiple of 16 bytes, and along K to the same K for both (the rows or
columns added are zeros, which add nothing to any sum: the product of the padded operands is C with, where N
or M grew, columns or rows more, which are not copied back).
"""

from __future__ import annotations

import dataclasses
import functools

from autotile.codegen.dtypes import ctype, itemsize
from autotile.errors import InvalidValueError

ALIGN_BYTES = 16  # a row of the padded operands starts at a multiple of this many bytes
# Elements under this many bytes are copied a warp to a run of neighbouring elements (each warp access 32
# neighbouring elements), wider ones a 16-byte vector per thread: loaded element by element from rows that
# start anywhere, 8 or 16 loads 16 bytes apart across the lanes ran the 16-bit copies at 0.7-1.4 TB/s (H100,
# 2026-11-28, tools/pad_probe.py), against 3 for float32's 4.
SEGMENT_BELOW_BYTES = 4
KERNEL_NAMES = ("autotile_pad", "autotile_unpad")


def aligned_size(size: int, element_bytes: int) -> int:
    """`size` elements rounded up to a multiple of ALIGN_BYTES bytes."""
    per = ALIGN_BYTES // element_bytes
    return -(-size // per) * per


@dataclasses.dataclass(frozen=True)
class Copy:
    """One operand's copy: its matrices of `rows` x `cols` (rows of `cols` elements, as stored) into
    `padded_rows` x `padded_cols`."""

    rows: int
    cols: int
    padded_rows: int
    padded_cols: int

    @property
    def elements(self) -> int:
        """Elements of one padded matrix."""
        return self.padded_rows * self.padded_cols

    @property
    def needed(self) -> bool:
        return (self.rows, self.cols) != (self.padded_rows, self.padded_cols)


@dataclasses.dataclass(frozen=True)
class PaddedShape:
    """The padded problem: its (M, N, K) (batch kept), and each operand's copy."""

    shape: tuple[int, ...]
    a: Copy
    b: Copy


def padded(layout: str, shape: tuple[int, ...], element_bytes: int, align_c: bool = False) -> PaddedShape:
    """The padded problem of a matmul of `shape` ((batch,) M, N, K) in `layout` ("nn", "nt", "tn", "tt": A's
    letter first, "n" row-major as it is, "t" stored transposed). `align_c`: C's rows aligned as well (N
    padded where B is stored N x K too, B's added rows zeros), for products that want C aligned."""
    if layout not in ("nn", "nt", "tn", "tt"):
        raise InvalidValueError(f"layout {layout!r} is not one of nn, nt, tn, tt")
    *batch, m, n, k = shape
    a_trans, b_trans = layout[0] == "t", layout[1] == "t"
    kp = aligned_size(k, element_bytes) if (not a_trans or b_trans) else k
    mp = aligned_size(m, element_bytes) if a_trans else m
    np_ = aligned_size(n, element_bytes) if not b_trans or align_c else n
    a = Copy(k, m, kp, mp) if a_trans else Copy(m, k, mp, kp)
    b = Copy(n, k, np_, kp) if b_trans else Copy(k, n, kp, np_)
    return PaddedShape((*batch, mp, np_, kp), a, b)


@functools.lru_cache(maxsize=8)
def render(dtype: str) -> str:
    """The CUDA source of the copy kernels for `dtype` (an input's type or an output's, such as int8's
    int32: elements of 1 to 8 bytes, moved 16 bytes at a time)."""
    from autotile.codegen.render import environment

    size = itemsize(dtype)
    if ALIGN_BYTES % size:
        raise InvalidValueError(f"the padded plan copies elements of 1, 2, 4 or 8 bytes, not {dtype}")
    return environment().get_template("pad.cu.j2").render(dtype=dtype, ctype=ctype(dtype), vec=ALIGN_BYTES // size,
                                                           segments=size < SEGMENT_BELOW_BYTES)


def copy_threads(rows: int, cols: int, element_bytes: int) -> int:
    """Threads of a copy kernel (`render`) over one matrix of `rows` x `cols` elements (the padded one's: `cols`
    a multiple of 16 bytes): one per 16-byte vector, or, for elements under SEGMENT_BELOW_BYTES, a warp per
    run of 32 vectors' elements of the matrix read as one array (rows x cols of them)."""
    per = ALIGN_BYTES // element_bytes
    if element_bytes >= SEGMENT_BELOW_BYTES:
        return rows * (cols // per)
    return -(-(rows * cols) // (32 * per)) * 32


def unpad_threads(rows: int, cols: int, src_cols: int, element_bytes: int) -> int:
    """Threads of the copy back (`autotile_unpad`) of one matrix's first `rows` x `cols` elements from rows of
    `src_cols`: one per 16-byte vector of src, or, for elements under SEGMENT_BELOW_BYTES, a warp per run of 32
    vectors' elements of a row of src where `cols` is at least that long, else of dst read as one array."""
    per = ALIGN_BYTES // element_bytes
    if element_bytes >= SEGMENT_BELOW_BYTES:
        return rows * (src_cols // per)
    if cols >= 32 * per:
        return rows * -(-src_cols // (32 * per)) * 32
    return copy_threads(rows, cols, element_bytes)


__all__ = ["ALIGN_BYTES", "KERNEL_NAMES", "SEGMENT_BELOW_BYTES", "Copy", "PaddedShape", "aligned_size",
           "copy_threads", "padded", "render", "unpad_threads"]
