"""Thread graphs: chains of elementwise operators fused to run in registers.

A thread graph is one block-level operator (OpKind.THREAD_GRAPH) whose ``program`` is a
tuple of steps ``(kind, operands, attrs)``. Operand ``j`` names the fused operator's ``j``-th
input when ``j < num_inputs`` and step ``j - num_inputs`` otherwise; the last step is the
result. Every step is an elementwise operator, so the whole program is one too.
"""

from __future__ import annotations

from typing import Any

from mugraph.errors import GraphStructureError, UnsupportedError
from mugraph.ir.ops import Group, OpKind

Step = tuple[OpKind, tuple[int, ...], tuple[tuple[str, Any], ...]]


def check_program(program, num_inputs: int) -> tuple[Step, ...]:
    steps = []
    for i, step in enumerate(program):
        try:
            kind, operands, attrs = step
        except (TypeError, ValueError):
            raise GraphStructureError(
                f"thread_graph: step {i} is not (kind, operands, attrs)"
            ) from None
        kind = OpKind(kind) if not isinstance(kind, OpKind) else kind
        if kind not in Group.ELEMENTWISE:
            raise UnsupportedError(f"thread_graph: step {i} is {kind.value}, not elementwise")
        arity = 2 if kind in Group.ELEMENTWISE_BINARY else 1
        operands = tuple(operands)
        if len(operands) != arity or any(not 0 <= j < num_inputs + i for j in operands):
            raise GraphStructureError(
                f"thread_graph: step {i} ({kind.value}) has bad operands {operands}"
            )
        steps.append((kind, operands, tuple(sorted(dict(attrs).items()))))
    if not steps:
        raise GraphStructureError("thread_graph: empty program")
    return tuple(steps)


def render_program(program: tuple[Step, ...], num_inputs: int) -> str:
    def name(j: int) -> str:
        return f"in{j}" if j < num_inputs else f"t{j - num_inputs}"

    parts = []
    for i, (kind, operands, attrs) in enumerate(program):
        args = ", ".join([name(j) for j in operands] + [f"{k}={v}" for k, v in attrs])
        parts.append(f"t{i}={kind.value}({args})")
    return "; ".join(parts)
