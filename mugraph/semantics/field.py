"""Finite-field semantics: every operator over Z_p × Z_q (paper §5, Table 3).

The same driver as the reference semantics (:mod:`mugraph.semantics.interpret`) walks the
graphs and partitions tensors, so imap / omap / forloop_dim mean exactly the same thing here.
Arithmetic comes from :mod:`mugraph.semantics.field_arith`. Operators outside LAX (sqrt, relu,
clamp, max, non-integer pow) are keyed uninterpreted functions of their field inputs — the same
function on both sides of a comparison, never an approximation. Silu and tanh-form gelu are
written with one exponential each: silu(x) = x / (1 + e^-x) and
gelu(x) = x · e^{2z} / (e^{2z} + 1) with z = √(2/π)(x + 0.044715 x³)
(as 1 + tanh z = 2e^{2z}/(e^{2z}+1)).

Matrix products go to :meth:`FieldContext.matmul` unfolded: :func:`~mugraph.semantics.
field_arith.matmul_mod` folds broadcast batch axes itself (the driver's
:func:`~mugraph.semantics.interpret.accumulated_matmul` still joins for-loop iterations).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from mugraph.ir.graph import Op
from mugraph.ir.ops import AccumKind, Level, OpKind
from mugraph.semantics.field_arith import FieldArray, FieldContext
from mugraph.semantics.interpret import (
    DRIVER_OWN_KINDS,
    EvalContext,
    Interpretation,
    Rule,
    lead_permutation,
    run_thread_graph,
)
from mugraph.semantics.partition import broadcast_iterations

_GELU_C = math.sqrt(2.0 / math.pi)


def _silu(f: FieldContext, x: FieldArray, op: Op) -> FieldArray:
    return f.div(x, f.add(f.ones(()), f.exp(f.neg(x))))


def _gelu(f: FieldContext, x: FieldArray, op: Op) -> FieldArray:
    z = f.mul_const(f.add(x, f.mul_const(f.mul(f.mul(x, x), x), 0.044715)), 2 * _GELU_C)
    e = f.exp(z)
    return f.mul(x, f.div(e, f.add(e, f.ones(()))))


def _pow(f: FieldContext, x: FieldArray, op: Op) -> FieldArray:
    e = op.attr("exponent")
    if float(e).is_integer() and e >= 0:
        return f.pow(x, int(e))
    return f.uninterpreted("pow", x, float(e))


UNARY: dict[OpKind, Callable[[FieldContext, FieldArray, Op], FieldArray]] = {
    OpKind.EXP: lambda f, x, op: f.exp(x),
    OpKind.SQUARE: lambda f, x, op: f.mul(x, x),
    OpKind.SQRT: lambda f, x, op: f.uninterpreted("sqrt", x),
    OpKind.SILU: _silu,
    OpKind.GELU: _gelu,
    OpKind.RELU: lambda f, x, op: f.uninterpreted("relu", x),
    OpKind.CLAMP: lambda f, x, op: f.uninterpreted(
        "clamp", x, op.attr("min_val"), op.attr("max_val")
    ),
    OpKind.MUL_SCALAR: lambda f, x, op: f.mul_const(x, op.attr("scalar")),
    OpKind.POW: _pow,
}

BINARY = {
    OpKind.ADD: FieldContext.add,
    OpKind.SUB: FieldContext.sub,
    OpKind.MUL: FieldContext.mul,
    OpKind.DIV: FieldContext.div,
}


def _unary(fn):
    def rule(interp, op, args, ctx):
        return [fn(interp.field, args[0], op)]

    return rule


def _binary(fn):
    def rule(interp, op, args, ctx):
        return [fn(interp.field, args[0], args[1])]

    return rule


def _matmul(interp, op, args, ctx):
    return [interp.field.matmul(args[0], args[1])]


def _reduction(interp, op, args, ctx):
    return [interp.field.sum(args[0], axis=ctx.lead + op.attr("dim"), keepdims=True)]


def _reduction_max(interp, op, args, ctx):
    return [interp.field.max_reduce(args[0], axis=ctx.lead + op.attr("dim"), keepdims=True)]


def sqrt_of_mean(f: FieldContext, sum_sq: FieldArray, count: int, eps: float = 0.0) -> FieldArray:
    """sqrt(sum / count + eps), the sqrt uninterpreted: shared by rms_norm and the rms
    accumulator. ``eps`` (a float, so an exact binary fraction) is added in the field."""
    mean = f.mul_const(sum_sq, _fraction(1, count))
    if eps:
        mean = f.add(mean, f.mul_const(f.ones(()), Fraction(eps)))
    return f.uninterpreted("sqrt", mean)


def _fraction(a: int, b: int) -> Fraction:
    return Fraction(a, b)


def _rms_norm(interp, op, args, ctx):
    f, x = interp.field, args[0]
    n_dims = len(op.attr("normalized_shape"))
    axes = tuple(range(x.ndim - n_dims, x.ndim))
    count = math.prod(x.shape[-n_dims:])
    sum_sq = f.sum(f.mul(x, x), axis=axes, keepdims=True)
    return [f.div(x, sqrt_of_mean(f, sum_sq, count, op.attr("eps", 0.0)))]


def _concat(interp, op, args, ctx):
    a, b = args
    shape = np.broadcast_shapes(a.shape[: ctx.lead], b.shape[: ctx.lead])
    a = a.broadcast_to(shape + a.shape[ctx.lead :])
    b = b.broadcast_to(shape + b.shape[ctx.lead :])
    return [interp.field.concatenate([a, b], axis=ctx.lead + op.attr("dim"))]


def _reshape(interp, op, args, ctx):
    x = args[0]
    return [x.reshape(x.shape[: ctx.lead] + tuple(op.attr("dims")))]


def _permute(interp, op, args, ctx):
    return [args[0].transpose(*lead_permutation(ctx.lead, op.attr("perm")))]


def _reduce_last(f: FieldContext, x: FieldArray, acc: AccumKind, dimx: int) -> FieldArray:
    if acc is AccumKind.NONE:
        return x
    if acc is AccumKind.SUM_TODIMX:
        *rest, last = x.shape
        return f.sum(x.reshape(*rest, dimx, last // dimx), axis=-1)
    if acc is AccumKind.RMS:
        x = f.mul(x, x)
    return f.sum(x, axis=-1, keepdims=True)


def _iterations(x: FieldArray, loops: int) -> FieldArray:
    return x.index_map(lambda a: broadcast_iterations(a, loops))


def _forloop_accum(interp, op, args, ctx):
    f, acc = interp.field, op.attr("acc")
    x = _iterations(args[0], ctx.forloop_range)
    total = f.sum(_reduce_last(f, x, acc, ctx.reduction_dimx), axis=0, keepdims=True)
    count = x.shape[-1] * ctx.forloop_range
    if acc is AccumKind.MEAN:
        total = f.mul_const(total, _fraction(1, count))
    elif acc is AccumKind.RMS:
        total = sqrt_of_mean(f, total, count, op.attr("eps", 0.0))
    return [total]


def _forloop_accum_max(interp, op, args, ctx):
    x = _iterations(args[0], ctx.forloop_range)
    return [interp.field.max_reduce(x, axis=0, keepdims=True)]


def _forloop_accum_rescale(interp, op, args, ctx):
    f, acc = interp.field, op.attr("acc")
    x = _reduce_last(f, _iterations(args[0], ctx.forloop_range), acc, ctx.reduction_dimx)
    scale = _iterations(args[1], ctx.forloop_range)
    shape = np.broadcast_shapes(x.shape[1:], scale.shape[1:])
    total = f.zeros(shape)
    for i in range(ctx.forloop_range):
        total = f.add(f.mul(total, scale[i]), x[i])
    return [total.reshape((1, *total.shape))]


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

DRIVER_KINDS = DRIVER_OWN_KINDS


class FieldInterpretation(Interpretation):
    """Values are :class:`FieldArray`; index-only functions apply to both components."""

    name = "finite-field"
    table = TABLE
    # matmul_mod folds broadcast batch axes itself, per component, in the order of the
    # operands' memory (tiles of one matrix fold back into that matrix: see its memo)
    folds_matmul = False

    def __init__(self, field: FieldContext) -> None:
        self.field = field

    def sum_axes(self, value: FieldArray, axes: tuple[int, ...]) -> FieldArray:
        return self.field.sum(value, axis=axes, keepdims=True)

    def relayout(self, value: FieldArray, fn: Callable[[Any], Any]) -> FieldArray:
        return value.index_map(fn)

    def apply(self, op: Op, args: list[Any], ctx: EvalContext) -> list[Any]:
        """With a fast context, a kernel-level operator applied again to the very same values
        (the other graph of a comparison computing the same norm of the same input, say)
        returns the first result: operators are functions of their inputs."""
        if not self.field.fast or ctx.level is not Level.KERNEL:
            return super().apply(op, args, ctx)
        memo = self.field.memo
        key = ("op", op.kind, op.attrs, tuple(id(a) for a in args))
        entry = memo.get(key)
        if entry is None:
            entry = (tuple(args), super().apply(op, args, ctx))  # args kept: ids stay theirs
            memo[key] = entry
        return list(entry[1])
