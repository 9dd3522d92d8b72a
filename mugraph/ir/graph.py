"""Immutable graph nodes: operators and frozen thread-block graphs.

A graph is a tuple of :class:`Op` in topological order; an operator's inputs are
:class:`TensorRef` positions of earlier operators' outputs. Attributes are stored as a sorted
tuple of (name, value) pairs so that every node is hashable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mugraph.ir.ops import OpKind
from mugraph.ir.tensor import TensorRef, TensorType

_MISSING = object()


def freeze_attrs(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(attrs.items()))


@dataclass(frozen=True)
class Op:
    """One operator: its kind, input positions, attributes and output types."""

    kind: OpKind
    inputs: tuple[TensorRef, ...]
    attrs: tuple[tuple[str, Any], ...]
    outputs: tuple[TensorType, ...]

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        if default is _MISSING:
            raise KeyError(f"{self.kind.value} has no attribute {name!r}")
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


def accumulates(op: Op) -> bool:
    """Whether a block output sums the blocks its omap leaves out (``new_output(...,
    accumulate=True)``) instead of placing every block's tile."""
    return bool(op.attr("accumulate", False))


@dataclass(frozen=True)
class BlockGraph:
    """The frozen computation of one thread block of a graph-defined kernel operator.

    ``ops`` holds input iterators (BLOCK_INPUT, one per kernel input, in order), block
    operators and output savers (BLOCK_OUTPUT, one per kernel output, in order).
    """

    grid_dim: tuple[int, int, int]
    block_dim: tuple[int, int, int]
    forloop_range: int
    reduction_dimx: int
    ops: tuple[Op, ...]

    @property
    def input_ops(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.kind is OpKind.BLOCK_INPUT)

    @property
    def output_ops(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.kind is OpKind.BLOCK_OUTPUT)

    @property
    def num_blocks(self) -> int:
        gx, gy, gz = self.grid_dim
        return gx * gy * gz

    def tensor_type(self, ref: TensorRef) -> TensorType:
        return self.ops[ref.op].outputs[ref.index]

    def uses(self) -> dict[int, list[tuple[int, int]]]:
        """For each operator position, (consumer position, operand position) of every use."""
        found: dict[int, list[tuple[int, int]]] = {}
        for i, op in enumerate(self.ops):
            for k, r in enumerate(op.inputs):
                found.setdefault(r.op, []).append((i, k))
        return found

    def structural_hash(self) -> str:
        from mugraph.ir.hashing import block_graph_hash

        return block_graph_hash(self)
