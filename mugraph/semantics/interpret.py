"""The evaluation driver shared by every value interpretation (reference floats, finite field).

An interpretation is a table from operator kind to a function computing the operator's outputs
from its inputs' values, plus ``relayout`` which applies an index-only NumPy function (split,
reshape, concatenate...) to a value: a float array is one NumPy array, a field value two. The
driver walks kernel graphs and block graphs, splits kernel inputs into block tiles and assembles
block outputs with :mod:`mugraph.semantics.partition`, so those mean the same everywhere.

Matrix products are laid out by the driver for every interpretation alike
(:func:`folded_matmul`, :func:`accumulated_matmul`): a block-level product is a batch over the
lead axes ``(F, gx, gy, gz)``, and an operand that is the same along a lead axis (size 1) while
the other varies lets that axis join the other operand's free dim, so one large product replaces
thousands of tiny ones. A product summed over the for-loop right away (``forloop_accum`` of a
``matmul``) joins the iterations into the reduction dim instead. Both are exact identities of
the values (the table's rule still computes every dot product, only the batching changes): the
field interpretation gives bit-identical results, floats differ by summation order only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mugraph.errors import UnsupportedError
from mugraph.ir import maps
from mugraph.ir.graph import BlockGraph, Op, accumulates
from mugraph.ir.ops import AccumKind, Group, Level, OpKind
from mugraph.ir.tensor import TensorRef
from mugraph.semantics.partition import (  # noqa: F401 - the layout helpers are re-exported
    LEAD,
    MatmulLayout,
    assemble_output,
    fold_cols,
    fold_rows,
    matmul_layout,
    split_input,
    unfold,
)


def lead_permutation(lead: int, perm: tuple[int, ...]) -> tuple[int, ...]:
    """``perm`` of a value's own dims as a permutation of its array, whose ``lead`` leading
    axes (rounds, blocks) stay in place."""
    return tuple(range(lead)) + tuple(lead + p for p in perm)


@dataclass(frozen=True)
class EvalContext:
    """Where an operator is evaluated: ``lead`` axes precede the tensor's own dims."""

    level: Level
    lead: int = 0
    forloop_range: int = 1
    reduction_dimx: int = 1


KERNEL_CONTEXT = EvalContext(Level.KERNEL)

Rule = Callable[[Any, Op, list[Any], EvalContext], list[Any]]


class Interpretation:
    """Base class: subclasses fill ``table`` and may override ``relayout``.

    Values must offer ``.shape``; ``relayout`` applies index-only NumPy functions to them.
    """

    name = "interpretation"
    table: dict[OpKind, Rule] = {}
    folds_matmul = True  # apply() batches products with folded_matmul

    def relayout(self, value: Any, fn: Callable[[Any], Any]) -> Any:
        return fn(value)

    def sum_axes(self, value: Any, axes: tuple[int, ...]) -> Any:
        """``value`` summed over ``axes``, kept as axes of one element (an accumulating
        block output's blocks)."""
        raise UnsupportedError(f"accumulating block outputs: no {self.name} semantics")

    def apply(self, op: Op, args: list[Any], ctx: EvalContext) -> list[Any]:
        rule = self.table.get(op.kind)
        if rule is None:
            raise UnsupportedError(f"{op.kind.value}: no {self.name} semantics")
        if op.kind is OpKind.MATMUL and self.folds_matmul:
            return [folded_matmul(self, rule, op, args[0], args[1], ctx)]
        return rule(self, op, args, ctx)


# ---- matrix products: batch axes folded into the free dims ---------------------------------------


def folded_matmul(
    interp: Interpretation, rule: Rule, op: Op, a: Any, b: Any, ctx: EvalContext
) -> Any:
    """``rule``'s matmul of a and b, with broadcast batch axes folded into the free dims.

    Row ``i`` of ``a[..., g, ...]`` times ``b`` is row ``(g, i)`` of the stacked rows when
    ``b`` is the same for every ``g`` (and symmetrically for columns), so the folded product
    holds exactly the same dot products as the batched one.
    """
    lay = matmul_layout(a.shape, b.shape)
    if not lay.folds:
        return rule(interp, op, [a, b], ctx)[0]
    fa = interp.relayout(a, lambda x: fold_rows(x, lay))
    fb = interp.relayout(b, lambda x: fold_cols(x, lay))
    c = rule(interp, op, [fa, fb], ctx)[0]
    return interp.relayout(c, lambda x: unfold(x, lay))


_SUM_OVER_ITERATIONS = Op(OpKind.FORLOOP_ACCUM, (), (("acc", AccumKind.NONE),), ())
_MATMUL = Op(OpKind.MATMUL, (), (), ())


def _iterations_into_k(x: np.ndarray, left: bool) -> np.ndarray:
    """A block value (F, g..., M, K) as (1, g..., M, F·K) (``left``) or (F, g..., K, N) as
    (1, g..., F·K, N): iteration f's slice of the reduction dim is ``[f·K, (f+1)·K)``."""
    axis = x.ndim - 2 if left else x.ndim - 3
    moved = np.moveaxis(x, 0, axis)
    shape = list(moved.shape)
    merged = shape[axis] * shape[axis + 1]
    return moved.reshape((1, *shape[:axis], merged, *shape[axis + 2 :]))


def accumulated_matmul(interp: Interpretation, a: Any, b: Any, ctx: EvalContext) -> Any:
    """``forloop_accum(matmul(a, b))`` (acc none) as one product: Σ_f a_f @ b_f.

    Both operands vary over the iterations: the iterations join the reduction dim,
    Σ_f a_f @ b_f = [a_0 … a_{F-1}] @ [b_0; …; b_{F-1}]. One is loop-invariant: the other is
    summed first, Σ_f a_f @ b = (Σ_f a_f) @ b. Neither: the product is accumulated as usual.
    """
    fa, fb = a.shape[0], b.shape[0]
    if fa > 1 and fb > 1:
        a = interp.relayout(a, lambda x: _iterations_into_k(x, True))
        b = interp.relayout(b, lambda x: _iterations_into_k(x, False))
        return interp.apply(_MATMUL, [a, b], ctx)[0]
    if fa > 1:
        a = interp.apply(_SUM_OVER_ITERATIONS, [a], ctx)[0]
    elif fb > 1:
        b = interp.apply(_SUM_OVER_ITERATIONS, [b], ctx)[0]
    else:
        product = interp.apply(_MATMUL, [a, b], ctx)[0]
        return interp.apply(_SUM_OVER_ITERATIONS, [product], ctx)[0]
    return interp.apply(_MATMUL, [a, b], ctx)[0]


@dataclass(frozen=True)
class _Deferred:
    """A matmul left unevaluated because its only use is a sum over the for-loop."""

    a: Any
    b: Any


def deferred_matmuls(block: BlockGraph) -> frozenset[int]:
    """Matmuls of ``block`` whose one and only use is a ``forloop_accum`` with acc none."""
    if block.forloop_range <= 1:
        return frozenset()
    uses: dict[int, list[Op]] = {}
    for op in block.ops:
        for ref in op.inputs:
            uses.setdefault(ref.op, []).append(op)
    return frozenset(
        i
        for i, op in enumerate(block.ops)
        if op.kind is OpKind.MATMUL
        and len(uses.get(i, [])) == 1
        and uses[i][0].kind is OpKind.FORLOOP_ACCUM
        and uses[i][0].attr("acc", AccumKind.NONE) is AccumKind.NONE
    )


# ---- graphs -----------------------------------------------------------------------------------


def run_kernel_graph(
    interp: Interpretation,
    ops: Sequence[Op],
    outputs: Sequence[TensorRef],
    inputs: Sequence[Any],
) -> list[Any]:
    """Evaluate a kernel graph on ``inputs`` (one value per INPUT operator, in order)."""
    values: list[list[Any]] = []
    for op in ops:
        if op.kind is OpKind.INPUT:
            values.append([inputs[op.attr("index")]])
            continue
        args = [values[r.op][r.index] for r in op.inputs]
        if op.kind is OpKind.CUSTOMIZED:
            values.append(run_block_graph(interp, op.attr("graph"), args))
        else:
            values.append(interp.apply(op, args, KERNEL_CONTEXT))
    return [values[r.op][r.index] for r in outputs]


def run_block_graph(interp: Interpretation, block: BlockGraph, dtensors: list[Any]) -> list[Any]:
    """Evaluate every block and iteration of a block graph at once (vectorized over blocks)."""
    ctx = EvalContext(Level.BLOCK, LEAD, block.forloop_range, block.reduction_dimx)
    deferred = deferred_matmuls(block)
    values: list[list[Any]] = []
    results: list[Any] = []
    for i, op in enumerate(block.ops):
        args = [values[r.op][r.index] for r in op.inputs]
        if op.kind is OpKind.BLOCK_INPUT:
            values.append([_block_input(interp, block, op, dtensors[op.attr("index")])])
        elif op.kind is OpKind.BLOCK_OUTPUT:
            results.append(_block_output(interp, block, op, args[0]))
            values.append([])
        elif i in deferred:
            values.append([_Deferred(args[0], args[1])])
        elif args and isinstance(args[0], _Deferred):
            values.append([accumulated_matmul(interp, args[0].a, args[0].b, ctx)])
        else:
            values.append(interp.apply(op, args, ctx))
    return results


def _block_input(interp: Interpretation, block: BlockGraph, op: Op, source: Any) -> Any:
    imap, fdim = op.attr("imap"), op.attr("forloop_dim")
    return interp.relayout(
        source, lambda a: split_input(a, block.grid_dim, imap, block.forloop_range, fdim)
    )


def _block_output(interp: Interpretation, block: BlockGraph, op: Op, value: Any) -> Any:
    tile = block.tensor_type(op.inputs[0]).dims
    omap, fdim = op.attr("omap"), op.attr("forloop_dim")
    if accumulates(op):  # the blocks the omap leaves out add their tiles: sum their lead axes
        axes = maps.summed_axes(block.grid_dim, omap)
        lead = (value.shape[0], *block.grid_dim)
        full = (*lead, *value.shape[len(lead):])
        value = interp.relayout(value, lambda a: np.broadcast_to(a, full))
        value = interp.sum_axes(value, tuple(1 + axis for axis in axes))
    else:
        axes = ()
    return interp.relayout(
        value,
        lambda a: assemble_output(a, tile, block.grid_dim, omap, block.forloop_range, fdim,
                                  bool(axes)),
    )


def run_thread_graph(
    interp: Interpretation, op: Op, args: list[Any], ctx: EvalContext
) -> list[Any]:
    """A thread graph's program, step by step, with the interpretation's own rules."""
    values = list(args)
    for kind, operands, attrs in op.attr("program"):
        step = Op(kind, (), attrs, ())
        values.append(interp.apply(step, [values[j] for j in operands], ctx)[0])
    return [values[-1]]


# Boundary operators (INPUT, BLOCK_INPUT, BLOCK_OUTPUT, CUSTOMIZED) are the driver's own work.
DRIVER_OWN_KINDS = frozenset(Group.BOUNDARY | {OpKind.CUSTOMIZED})
