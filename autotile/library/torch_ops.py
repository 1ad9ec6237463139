"""autotile's operations as PyTorch custom operators, for torch.compile and autograd.

``import autotile.torch`` (which imports torch; ``import autotile`` never does) registers:

- ``torch.ops.autotile.matmul(A, B, precision=None) -> Tensor``: `autotile.matmul` (2-D, batched,
  transposed operands), differentiable (its backward runs autotile's matmul on the transposed operands,
  read in place);
- ``torch.ops.autotile.matmul_out(A, B, out, precision=None)``: the same into `out` (for CUDA graphs);
- ``torch.ops.autotile.matvec(A, x, precision=None) -> Tensor``: `autotile.matvec`.

Each has a shape function (a "fake" implementation), so torch.compile traces through the call without a
graph break and Inductor calls autotile at run time. `autotile.torch.matmul` and friends are the same
operators under Python names. In eager code `autotile.matmul` on tensors that need a gradient goes through
this operator by itself.
"""

# No `from __future__ import annotations`: torch.library reads the operators' schema from real annotations.

import math
from typing import Optional

import torch

from autotile.errors import ArgumentError
from autotile.library import calls


def _batch_shape(a: torch.Tensor, b: torch.Tensor) -> tuple:
    a_batch, b_batch = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    return max(a_batch, b_batch, key=lambda dims: (math.prod(dims), len(dims)))


@torch.library.custom_op("autotile::matmul", mutates_args=())
def matmul(A: torch.Tensor, B: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    """`autotile.matmul(A, B)` as a PyTorch operator."""
    return calls.matmul_no_autograd(A, B, precision=precision)


@matmul.register_fake
def _matmul_shape(A: torch.Tensor, B: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    if A.dim() < 2 or B.dim() < 2:
        raise ArgumentError(f"matmul takes tensors of 2 or more dimensions; got {A.dim()} and {B.dim()}")
    torch._check(A.shape[-1] == B.shape[-2], lambda: f"matmul shapes do not match: {A.shape} @ {B.shape}")
    # int8's products are int32 (torch._int_mm's contract); every other type's are of the inputs' type
    dtype = torch.int32 if A.dtype == torch.int8 else A.dtype
    return A.new_empty((*_batch_shape(A, B), A.shape[-2], B.shape[-1]), dtype=dtype)


def _matmul_backward(ctx, grad: torch.Tensor):
    A, B = ctx.saved_tensors
    grad_a = grad_b = None
    # dA = dC B^T and dB = A^T dC: the transposes are views, read in place (layouts nt and tn); a broadcast
    # operand's gradient is summed over the batch.
    if ctx.needs_input_grad[0]:
        grad_a = matmul(grad, B.mT, ctx.precision).sum_to_size(A.shape)
    if ctx.needs_input_grad[1]:
        grad_b = matmul(A.mT, grad, ctx.precision).sum_to_size(B.shape)
    return grad_a, grad_b, None


def _matmul_save(ctx, inputs, output) -> None:
    A, B, precision = inputs
    ctx.save_for_backward(A, B)
    ctx.precision = precision


matmul.register_autograd(_matmul_backward, setup_context=_matmul_save)


@torch.library.custom_op("autotile::matmul_out", mutates_args=("out",))
def matmul_out(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, precision: Optional[str] = None) -> None:
    """`autotile.matmul(A, B, out=out)` as a PyTorch operator (no allocation: CUDA-graph safe)."""
    calls.matmul_no_autograd(A, B, out=out, precision=precision)


@matmul_out.register_fake
def _matmul_out_shape(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, precision: Optional[str] = None) -> None:
    return None


@torch.library.custom_op("autotile::matvec", mutates_args=())
def matvec(A: torch.Tensor, x: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    """`autotile.matvec(A, x)` as a PyTorch operator."""
    return calls.matvec(A, x, precision=precision)


@matvec.register_fake
def _matvec_shape(A: torch.Tensor, x: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    torch._check(A.dim() == 2 and x.dim() == 1, lambda: "matvec takes a 2-D A and a 1-D x")
    torch._check(A.shape[1] == x.shape[0], lambda: f"matvec shapes do not match: {A.shape} @ {x.shape}")
    return A.new_empty((A.shape[0],))


__all__ = ["matmul", "matmul_out", "matvec"]
