"""How a matmul call's operands map to a problem the kernels compute, from shapes and strides alone.

Each matrix is read where it lies when it is packed row-major ("n") or column-major ("t": `W.T` of a
row-major W), which gives the four layouts nn, nt, tn, tt. A batch (3-D or more, the leading dimensions
merging into one batch stride) runs as one bmm launch along grid z; a 2-D operand, or a batch of one, is
broadcast over the other's batch (batch stride 0). A batch of row-major A matrices stored one after the
other times a 2-D B is one tall matmul ((batch x M) x K times K x N), as PyTorch folds a linear layer.
Anything else (a general strided view, negative strides) is copied to row-major first: `copy_a`/`copy_b`.

Pure Python on tuples, so every case is tested without a GPU (tests/test_plan.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from autotile.errors import ArgumentError


class MatmulPlan(NamedTuple):
    """What runs a call: `kernel` ("matmul" or "bmm") on `shape` (MxNxK, or batchxMxNxK) in `layout`; the
    result's shape as the caller sees it (`out_shape`, row-major); each operand's batch stride in elements
    (0: broadcast); or the operands to copy to row-major first (then nothing else is meaningful). `kernel`
    "" without copies: an empty product, all zeros."""

    kernel: str
    layout: str
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    batch_strides: tuple[int, ...]  # (A's, B's) for bmm, () otherwise
    copy_a: bool = False
    copy_b: bool = False


def matrix_order(rows: int, cols: int, row_stride: int, col_stride: int) -> str | None:
    """"n" for a packed row-major matrix, "t" for a packed column-major one, None for anything else.
    A dimension of size 1 has no stride to respect; where both read alike, "n"."""
    if (cols == 1 or col_stride == 1) and (rows == 1 or row_stride == cols):
        return "n"
    if (rows == 1 or row_stride == 1) and (cols == 1 or col_stride == rows):
        return "t"
    return None


def batch_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The one stride of an operand's batch dimensions (all but the last two), merged; 0 for a batch of one
    (or none); None where the dimensions do not merge into one stride (or it is negative)."""
    dims = [(n, s) for n, s in zip(shape[:-2], strides[:-2], strict=True) if n != 1]
    if not dims:
        return 0
    for (_, outer), (inner_n, inner) in zip(dims, dims[1:], strict=False):
        if outer != inner * inner_n:
            return None
    stride = dims[-1][1]
    return stride if stride >= 0 else None


def plan_matmul(a_shape: tuple[int, ...], a_strides: tuple[int, ...], b_shape: tuple[int, ...],
                b_strides: tuple[int, ...]) -> MatmulPlan:
    """The plan for A @ B (each 2-D or more; shapes and strides in elements). Raises `ArgumentError` for
    shapes that do not multiply."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ArgumentError(f"matmul takes arrays of 2 or more dimensions; got A with {len(a_shape)} and B with "
                            f"{len(b_shape)}")
    M, K = a_shape[-2:]
    K2, N = b_shape[-2:]
    if K != K2:
        raise ArgumentError(f"matmul shapes do not match: A is {'x'.join(map(str, a_shape))}, B is "
                            f"{'x'.join(map(str, b_shape))} ({K} != {K2})")
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    if a_batch and b_batch and a_batch != b_batch and math.prod(a_batch) != 1 and math.prod(b_batch) != 1:
        raise ArgumentError(f"matmul batch dimensions do not match: A has {a_batch}, B has {b_batch} (they must be "
                            "equal, or one operand a single matrix)")
    batch_shape = max(a_batch, b_batch, key=lambda dims: (math.prod(dims), len(dims)))
    batch = math.prod(batch_shape)
    out_shape = (*batch_shape, M, N)
    if batch == 0 or min(M, N, K) == 0:
        return MatmulPlan("", "", (), out_shape, (0, 0))  # nothing to compute: the result is zeros (or empty)

    a_order = matrix_order(M, K, *a_strides[-2:])
    b_order = matrix_order(K, N, *b_strides[-2:])
    a_stride = batch_stride(a_shape, a_strides)
    b_stride = batch_stride(b_shape, b_strides)
    copy_a, copy_b = a_order is None or a_stride is None, b_order is None or b_stride is None
    if copy_a or copy_b:
        return MatmulPlan("", "", (), out_shape, (0, 0), copy_a, copy_b)
    assert a_order is not None and b_order is not None and a_stride is not None and b_stride is not None
    a_stride = a_stride if math.prod(a_batch) > 1 else 0
    b_stride = b_stride if math.prod(b_batch) > 1 else 0
    layout = a_order + b_order
    if batch == 1:
        return MatmulPlan("matmul", layout, (M, N, K), out_shape, ())
    if b_stride == 0 and a_order == "n" and a_stride == M * K:
        # Row-major A matrices one after the other are one tall row-major matrix; C is laid out the same.
        return MatmulPlan("matmul", layout, (batch * M, N, K), out_shape, ())
    return MatmulPlan("bmm", layout, (batch, M, N, K), out_shape, (a_stride, b_stride))


__all__ = ["MatmulPlan", "batch_stride", "matrix_order", "plan_matmul"]
