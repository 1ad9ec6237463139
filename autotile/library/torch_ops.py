"""autotile's operations as PyTorch custom operators, for torch.compile and autograd.

``import autotile.torch`` (which imports torch; ``import autotile`` never does) registers:

- ``torch.ops.autotile.matmul(A, B, precision=None) -> Tensor``: `autotile.matmul` (2-D, batched,
  transposed operands), differentiable (its backward runs autotile's matmul on the transposed operands,
  read in place);
- ``torch.ops.autotile.matmul_out(A, B, out, precision=None)``: the same into `out` (for CUDA graphs);
- ``torch.ops.autotile.matvec(A, x, precision=None) -> Tensor``: `autotile.matvec`, differentiable (dA is
  the outer product g x^T, a matmul of K = 1; dx = A^T g, a matvec of A's transpose read in place).

Each has a shape function (a "fake" implementation), so torch.compile traces through the call without a
graph break and Inductor calls autotile at run time. `autotile.torch.matmul` and friends are the same
operators under Python names. In eager code `autotile.matmul` and `autotile.matvec` on tensors that need
a gradient go through these operators by themselves.
"""

# No `from __future__ import annotations`: torch.library reads the operators' schema from real annotations.

import math
from typing import Callable, Optional

import torch

from autotile.dispatch.precision import get_float32_matmul_precision
from autotile.errors import ArgumentError
from autotile.library import calls
from autotile.runtime import torch_lookup
from autotile.runtime.torch_lookup import MATMUL, MATVEC


def _batch_shape(a: torch.Tensor, b: torch.Tensor) -> tuple:
    a_batch, b_batch = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    return max(a_batch, b_batch, key=lambda dims: (math.prod(dims), len(dims)))


# matmul and matvec are defined through `torch.library.Library` rather than `torch.library.custom_op`: the
# latter wraps every call in Python (an output-aliasing check, a torch.compile guard, a generic autograd
# layer that flattens the arguments), 13-16 us per eager call on an H200 host (2026-11-28), more than autotile's
# whole call. Here the dispatcher calls autotile directly, after one small autograd kernel of our own.
_library = torch.library.Library("autotile", "FRAGMENT")
_library.define("matmul(Tensor A, Tensor B, str? precision=None) -> Tensor")
_library.define("matvec(Tensor A, Tensor x, str? precision=None) -> Tensor")


def _matmul_kernel(A: torch.Tensor, B: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    # Registered for every backend (CompositeExplicitAutograd): a CPU tensor gets autotile's typed error.
    # A repeated call takes the library's per-call path, as `autotile.matmul` does: the compiled lookup first.
    compiled = torch_lookup.extension
    if compiled is not None:
        setting = get_float32_matmul_precision() if precision is None else precision
        C = compiled.call(MATMUL, A, B, None, setting, None)
        if C is not None:
            return C
    known = calls.repeated_call(A, B, None, precision)
    if known is not None:
        return known(A, B, None, None)
    return calls.matmul_no_autograd(A, B, precision=precision)


def _matmul_shape(A: torch.Tensor, B: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    if A.dim() < 2 or B.dim() < 2:
        raise ArgumentError(f"matmul takes tensors of 2 or more dimensions; got {A.dim()} and {B.dim()}")
    torch._check(A.shape[-1] == B.shape[-2], lambda: f"matmul shapes do not match: {A.shape} @ {B.shape}")
    # int8's products are int32 (torch._int_mm's contract); every other type's are of the inputs' type
    dtype = torch.int32 if A.dtype == torch.int8 else A.dtype
    return A.new_empty((*_batch_shape(A, B), A.shape[-2], B.shape[-1]), dtype=dtype)


class _Operands(torch.autograd.Function):
    """An operator's function of two operands and a precision: both operands saved for the backward."""

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        first, second, precision = inputs
        ctx.save_for_backward(first, second)
        ctx.precision = precision


class _DifferentiableMatmul(_Operands):
    """The operator with its gradients. dA = dC B^T and dB = A^T dC: the transposes are views, read in place
    (layouts nt and tn); a broadcast operand's gradient is summed over the batch. The backward calls the
    operator itself, so it is differentiable again."""

    @staticmethod
    def forward(A: torch.Tensor, B: torch.Tensor, precision: Optional[str]) -> torch.Tensor:
        return matmul(A, B, precision)  # grad mode is off in here: the autograd kernel runs the kernel itself

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        A, B = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = matmul(grad, B.mT, ctx.precision).sum_to_size(A.shape)
        if ctx.needs_input_grad[1]:
            grad_b = matmul(A.mT, grad, ctx.precision).sum_to_size(B.shape)
        return grad_a, grad_b, None


class _DifferentiableMatvec(_Operands):
    """The matvec operator with its gradients: dA = g x^T (the matmul operator with K = 1)
    and dx = A^T g (the matvec operator on A's transpose, a view). Differentiable again, as matmul's."""

    @staticmethod
    def forward(A: torch.Tensor, x: torch.Tensor, precision: Optional[str]) -> torch.Tensor:
        return matvec(A, x, precision)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        A, x = ctx.saved_tensors
        grad_a = grad_x = None
        if ctx.needs_input_grad[0]:
            grad_a = matmul(grad.unsqueeze(1), x.unsqueeze(0), ctx.precision)
        if ctx.needs_input_grad[1]:
            grad_x = matvec(A.mT, grad, ctx.precision)
        return grad_a, grad_x, None


_below_autograd = torch._C._AutoDispatchBelowAutograd
_dispatch_modes = torch._C._len_torch_dispatch_stack  # FakeTensorMode, the tracers' proxy modes
_functorch_active = torch._C._are_functorch_transforms_active  # vmap, grad, functionalize
_Plain = torch.Tensor


def _autograd_kernel(function: type[torch.autograd.Function], kernel: Callable[..., torch.Tensor],
                     operator: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The Autograd key's kernel of an operator: a call autograd must see records `function`. Any other
    runs `kernel` directly for plain tensors with nothing watching the dispatcher (a second dispatch costs
    3-4 us of host time), else `operator` through the dispatcher below autograd (while torch.compile
    traces: the shape function)."""

    def autograd(A: torch.Tensor, B: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
        if torch.is_grad_enabled() and (A.requires_grad or B.requires_grad):
            return function.apply(A, B, precision)
        if type(A) is _Plain and type(B) is _Plain and not _dispatch_modes() and not _functorch_active():
            return kernel(A, B, precision)
        with _below_autograd():
            return operator(A, B, precision)

    return autograd


def _matvec_kernel(A: torch.Tensor, x: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    compiled = torch_lookup.extension  # the compiled lookup first, as `autotile.matvec` does
    if compiled is not None:
        setting = get_float32_matmul_precision() if precision is None else precision
        y = compiled.call(MATVEC, A, x, None, setting, None)
        if y is not None:
            return y
    return calls.matvec_no_autograd(A, x, precision=precision)  # which takes the per-call path first


def _matvec_shape(A: torch.Tensor, x: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    torch._check(A.dim() == 2 and x.dim() == 1, lambda: "matvec takes a 2-D A and a 1-D x")
    torch._check(A.shape[1] == x.shape[0], lambda: f"matvec shapes do not match: {A.shape} @ {x.shape}")
    return A.new_empty((A.shape[0],))


matmul = torch.ops.autotile.matmul.default
"""`autotile.matmul(A, B, precision=None)` as a PyTorch operator, differentiable."""
matvec = torch.ops.autotile.matvec.default
"""`autotile.matvec(A, x, precision=None)` as a PyTorch operator, differentiable."""

_library.impl("matmul", _matmul_kernel, "CompositeExplicitAutograd")
_library.impl("matmul", _autograd_kernel(_DifferentiableMatmul, _matmul_kernel, matmul), "Autograd")
_library.impl("matvec", _matvec_kernel, "CompositeExplicitAutograd")
_library.impl("matvec", _autograd_kernel(_DifferentiableMatvec, _matvec_kernel, matvec), "Autograd")
torch.library.register_fake("autotile::matmul", _matmul_shape, lib=_library)
torch.library.register_fake("autotile::matvec", _matvec_shape, lib=_library)


# matmul_out mutates `out`: custom_op also bumps its version counter for autograd, which is worth its cost on
# the call CUDA graphs capture (a replay runs no Python).
@torch.library.custom_op("autotile::matmul_out", mutates_args=("out",))
def matmul_out(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, precision: Optional[str] = None) -> None:
    """`autotile.matmul(A, B, out=out)` as a PyTorch operator (no allocation: CUDA-graph safe)."""
    calls.matmul_no_autograd(A, B, out=out, precision=precision)


@matmul_out.register_fake
def _matmul_out_shape(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, precision: Optional[str] = None) -> None:
    return None


__all__ = ["matmul", "matmul_out", "matvec"]
