"""Reference semantics: what every operator computes, in floating point on the CPU (NumPy).

This is the definition the other interpretations and the generated kernels are tested
against. Values are float64 arrays by default; block-level values carry the lead axes
``(F, gx, gy, gz)`` of :mod:`mugraph.semantics.partition`, so one call evaluates every block
and every for-loop iteration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mugraph.ir.graph import Op
from mugraph.ir.ops import AccumKind, OpKind
from mugraph.ir.tensor import TensorRef
from mugraph.semantics.interpret import (
    DRIVER_OWN_KINDS,
    Interpretation,
    Rule,
    lead_permutation,
    run_kernel_graph,
    run_thread_graph,
)
from mugraph.semantics.partition import broadcast_iterations

_GELU_C = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _unary(fn):
    def rule(interp, op: Op, args, ctx):
        return [fn(args[0], op)]

    return rule


def _binary(fn):
    def rule(interp, op: Op, args, ctx):
        return [fn(args[0], args[1])]

    return rule


UNARY = {
    OpKind.EXP: lambda x, op: np.exp(x),
    OpKind.SQUARE: lambda x, op: x * x,
    OpKind.SQRT: lambda x, op: np.sqrt(x),
    OpKind.SILU: lambda x, op: silu(x),
    OpKind.GELU: lambda x, op: gelu_tanh(x),
    OpKind.RELU: lambda x, op: np.maximum(x, 0.0),
    OpKind.CLAMP: lambda x, op: np.clip(x, op.attr("min_val"), op.attr("max_val")),
    OpKind.MUL_SCALAR: lambda x, op: x * op.attr("scalar"),
    OpKind.POW: lambda x, op: np.power(x, op.attr("exponent")),
}

BINARY = {
    OpKind.ADD: np.add,
    OpKind.SUB: np.subtract,
    OpKind.MUL: np.multiply,
    OpKind.DIV: np.divide,
}


def _matmul(interp, op, args, ctx):
    return [np.matmul(args[0], args[1])]


def _reduction(interp, op, args, ctx):
    return [args[0].sum(axis=ctx.lead + op.attr("dim"), keepdims=True)]


def _reduction_max(interp, op, args, ctx):
    return [args[0].max(axis=ctx.lead + op.attr("dim"), keepdims=True)]


def _rms_norm(interp, op, args, ctx):
    x = args[0]
    axes = tuple(range(x.ndim - len(op.attr("normalized_shape")), x.ndim))
    return [x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + op.attr("eps", 0.0))]


def _broadcast_lead(a: np.ndarray, b: np.ndarray, lead: int) -> tuple[np.ndarray, np.ndarray]:
    """Give two block values the same lead axes so they can be concatenated."""
    shape = np.broadcast_shapes(a.shape[:lead], b.shape[:lead])
    return (
        np.broadcast_to(a, shape + a.shape[lead:]),
        np.broadcast_to(b, shape + b.shape[lead:]),
    )


def _concat(interp, op, args, ctx):
    a, b = _broadcast_lead(args[0], args[1], ctx.lead)
    return [np.concatenate([a, b], axis=ctx.lead + op.attr("dim"))]


def _reshape(interp, op, args, ctx):
    x = args[0]
    return [np.reshape(x, x.shape[: ctx.lead] + tuple(op.attr("dims")))]


def _permute(interp, op, args, ctx):
    x = args[0]
    return [np.transpose(x, lead_permutation(ctx.lead, op.attr("perm")))]


def _reduce_last(x: np.ndarray, acc: AccumKind, dimx: int) -> np.ndarray:
    """The per-iteration part of an accumulator: what is summed over iterations."""
    if acc is AccumKind.NONE:
        return x
    if acc is AccumKind.SUM_TODIMX:
        *rest, last = x.shape
        return x.reshape(*rest, dimx, last // dimx).sum(axis=-1)
    if acc is AccumKind.RMS:
        x = x * x
    return x.sum(axis=-1, keepdims=True)


def _forloop_accum(interp, op, args, ctx):
    acc = op.attr("acc")
    x = broadcast_iterations(args[0], ctx.forloop_range)
    total = _reduce_last(x, acc, ctx.reduction_dimx).sum(axis=0, keepdims=True)
    if acc in (AccumKind.MEAN, AccumKind.RMS):
        total = total / (x.shape[-1] * ctx.forloop_range)
    if acc is AccumKind.RMS:
        total = np.sqrt(total + op.attr("eps", 0.0))
    return [total]


def _forloop_accum_max(interp, op, args, ctx):
    return [broadcast_iterations(args[0], ctx.forloop_range).max(axis=0, keepdims=True)]


def _forloop_accum_rescale(interp, op, args, ctx):
    acc = op.attr("acc")
    x = _reduce_last(broadcast_iterations(args[0], ctx.forloop_range), acc, ctx.reduction_dimx)
    scale = broadcast_iterations(args[1], ctx.forloop_range)
    total = np.zeros(np.broadcast_shapes(x.shape[1:], scale.shape[1:]))
    for i in range(ctx.forloop_range):
        total = total * scale[i] + x[i]
    return [total[None]]


TABLE: dict[OpKind, Rule] = {
    **{kind: _unary(fn) for kind, fn in UNARY.items()},
    **{kind: _binary(fn) for kind, fn in BINARY.items()},
    OpKind.MATMUL: _matmul,
    OpKind.REDUCTION: _reduction,
    OpKind.REDUCTION_MAX: _reduction_max,
    OpKind.RMS_NORM: _rms_norm,
    OpKind.CONCAT: _concat,
    OpKind.RESHAPE: _reshape,
    OpKind.PERMUTE: _permute,
    OpKind.FORLOOP_ACCUM: _forloop_accum,
    OpKind.FORLOOP_ACCUM_MAX: _forloop_accum_max,
    OpKind.FORLOOP_ACCUM_RESCALE: _forloop_accum_rescale,
    OpKind.THREAD_GRAPH: run_thread_graph,
}

# Boundary operators (INPUT, BLOCK_INPUT, BLOCK_OUTPUT, CUSTOMIZED) are the driver's own work.
DRIVER_KINDS = DRIVER_OWN_KINDS


class Reference(Interpretation):
    name = "reference"
    table = TABLE

    def sum_axes(self, value: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return value.sum(axis=axes, keepdims=True)


REFERENCE = Reference()


def evaluate(graph, inputs: Sequence[np.ndarray], dtype=np.float64) -> list[np.ndarray]:
    """Evaluate a kernel graph on NumPy inputs in ``dtype`` (float64 by default)."""
    arrays = [np.asarray(x, dtype=dtype) for x in inputs]
    return evaluate_ops(graph.ops, graph.outputs, arrays)


def evaluate_ops(
    ops, outputs: Sequence[TensorRef], inputs: Sequence[np.ndarray]
) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        results = run_kernel_graph(REFERENCE, ops, outputs, inputs)
    return [np.ascontiguousarray(r) for r in results]
