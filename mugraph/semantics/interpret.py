"""The evaluation driver shared by every value interpretation (reference floats, finite field).

An interpretation is a table from operator kind to a function computing the operator's outputs
from its inputs' values, plus ``relayout`` which applies an index-only NumPy function (split,
reshape, concatenate...) to a value: a float array is one NumPy array, a field value two. The
driver walks kernel graphs and block graphs, splits kernel inputs into block tiles and assembles
block outputs with :mod:`mugraph.semantics.partition`, so those mean the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mugraph.errors import UnsupportedError
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import Level, OpKind
from mugraph.ir.tensor import TensorRef
from mugraph.semantics.partition import LEAD, assemble_output, split_input


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
    """Base class: subclasses fill ``table`` and may override ``relayout``."""

    name = "interpretation"
    table: dict[OpKind, Rule] = {}

    def relayout(self, value: Any, fn: Callable[[Any], Any]) -> Any:
        return fn(value)

    def apply(self, op: Op, args: list[Any], ctx: EvalContext) -> list[Any]:
        rule = self.table.get(op.kind)
        if rule is None:
            raise UnsupportedError(f"{op.kind.value}: no {self.name} semantics")
        return rule(self, op, args, ctx)


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
    values: list[list[Any]] = []
    results: list[Any] = []
    for op in block.ops:
        args = [values[r.op][r.index] for r in op.inputs]
        if op.kind is OpKind.BLOCK_INPUT:
            imap, fdim = op.attr("imap"), op.attr("forloop_dim")
            source = dtensors[op.attr("index")]
            values.append(
                [interp.relayout(source, lambda a: split_input(a, block.grid_dim, imap, block.forloop_range, fdim))]
            )
        elif op.kind is OpKind.BLOCK_OUTPUT:
            tile = block.tensor_type(op.inputs[0]).dims
            omap, fdim = op.attr("omap"), op.attr("forloop_dim")
            results.append(
                interp.relayout(
                    args[0],
                    lambda a: assemble_output(a, tile, block.grid_dim, omap, block.forloop_range, fdim),
                )
            )
            values.append([])
        else:
            values.append(interp.apply(op, args, ctx))
    return results
