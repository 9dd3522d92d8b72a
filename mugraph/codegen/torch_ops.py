"""Pre-defined kernel operators, run through PyTorch (cuBLAS for matmul, ATen elementwise).

Each entry computes an operator with the meaning of :mod:`mugraph.semantics.reference`, in
the graph's dtype. PyTorch evaluates half-precision elementwise math and reductions in
float32 internally; rms_norm is composed here, so it is computed in float32 explicitly.
GELU is the tanh form, ``rms_norm`` adds its ``eps`` (0 when absent), reductions keep their
dim with size 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mugraph.errors import UnsupportedError
from mugraph.ir.graph import Op
from mugraph.ir.ops import Group, OpKind

TorchKernel = Callable[[Op, list[Any]], Any]


def _torch():
    import torch

    return torch


def _unary(fn: Callable[[Any, Op], Any]) -> TorchKernel:
    return lambda op, args: fn(args[0], op)


def _gelu(x, op):
    return _torch().nn.functional.gelu(x, approximate="tanh")


def _pow(x, op):
    return _torch().pow(x, op.attr("exponent"))


def _rms_norm(op: Op, args: list[Any]):
    x = args[0]
    xf = x.float()
    dims = tuple(range(x.dim() - len(op.attr("normalized_shape")), x.dim()))
    eps = op.attr("eps", 0.0)
    return (xf / (xf.square().mean(dim=dims, keepdim=True) + eps).sqrt()).to(x.dtype)


def _reshape(op: Op, args: list[Any]):
    return args[0].reshape(op.attr("dims"))


def _customized(op: Op, args: list[Any]):
    raise UnsupportedError("customized operators run as generated Triton kernels")


def _input(op: Op, args: list[Any]):
    raise UnsupportedError("graph inputs are bound by the runtime")


TORCH_KERNELS: dict[OpKind, TorchKernel] = {
    OpKind.INPUT: _input,
    OpKind.CUSTOMIZED: _customized,
    OpKind.EXP: _unary(lambda x, op: _torch().exp(x)),
    OpKind.SQUARE: _unary(lambda x, op: _torch().square(x)),
    OpKind.SQRT: _unary(lambda x, op: _torch().sqrt(x)),
    OpKind.SILU: _unary(lambda x, op: _torch().nn.functional.silu(x)),
    OpKind.GELU: _unary(_gelu),
    OpKind.RELU: _unary(lambda x, op: _torch().relu(x)),
    OpKind.CLAMP: _unary(lambda x, op: _torch().clamp(x, op.attr("min_val"), op.attr("max_val"))),
    OpKind.MUL_SCALAR: _unary(lambda x, op: x * op.attr("scalar")),
    OpKind.POW: _unary(_pow),
    OpKind.ADD: lambda op, a: _torch().add(a[0], a[1]),
    OpKind.SUB: lambda op, a: _torch().sub(a[0], a[1]),
    OpKind.MUL: lambda op, a: _torch().mul(a[0], a[1]),
    OpKind.DIV: lambda op, a: _torch().div(a[0], a[1]),
    OpKind.MATMUL: lambda op, a: _torch().matmul(a[0], a[1]),
    OpKind.REDUCTION: lambda op, a: a[0].sum(dim=op.attr("dim"), keepdim=True),
    OpKind.RMS_NORM: _rms_norm,
    OpKind.CONCAT: lambda op, a: _torch().cat([a[0], a[1]], dim=op.attr("dim")),
    OpKind.RESHAPE: _reshape,
    OpKind.PERMUTE: lambda op, a: a[0].permute(op.attr("perm")),  # a view
}

assert set(TORCH_KERNELS) == Group.KERNEL, "every kernel-level operator needs a PyTorch entry"


def run_torch_op(op: Op, args: list[Any]) -> Any:
    """Evaluate one pre-defined kernel operator on torch tensors."""
    kernel = TORCH_KERNELS.get(op.kind)
    if kernel is None or op.kind in (OpKind.INPUT, OpKind.CUSTOMIZED):
        raise UnsupportedError(f"{op.kind.value}: no PyTorch kernel")
    return kernel(op, args)
