"""Where a block-graph value lives relative to the for-loop.

INVARIANT values depend only on inputs that are the same every iteration; LOOP values change
every iteration; POST values are computed once after the loop, from accumulators. A block
operator may combine INVARIANT with either of the others, but never LOOP with POST.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mugraph.ir.ops import Group, OpKind

if TYPE_CHECKING:
    from mugraph.ir.graph import BlockGraph, Op


class Phase(enum.IntEnum):
    INVARIANT = 0
    LOOP = 1
    POST = 2


def combine_phases(phases: Iterable[Phase]) -> Phase:
    """The phase of an operator's result from its inputs' phases (the later one wins)."""
    return max(phases, default=Phase.INVARIANT)


def op_phase(op: Op, input_phases: Iterable[Phase]) -> Phase:
    """The phase of a block operator: inputs without a forloop_dim are INVARIANT, with one
    LOOP; accumulators are POST; anything else takes the latest phase of its inputs."""
    if op.kind is OpKind.BLOCK_INPUT:
        return Phase.INVARIANT if op.attr("forloop_dim") < 0 else Phase.LOOP
    if op.kind in Group.ACCUMULATOR:
        return Phase.POST
    return combine_phases(input_phases)


def block_phases(block: BlockGraph) -> list[Phase]:
    """The phase of every operator of ``block``, by position."""
    phases: list[Phase] = []
    for op in block.ops:
        phases.append(op_phase(op, (phases[r.op] for r in op.inputs)))
    return phases
