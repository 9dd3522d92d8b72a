"""Where a block-graph value lives relative to the for-loop.

INVARIANT values depend only on inputs that are the same every iteration; LOOP values change
every iteration; POST values are computed once after the loop, from accumulators. A block
operator may combine INVARIANT with either of the others, but never LOOP with POST.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Phase(enum.IntEnum):
    INVARIANT = 0
    LOOP = 1
    POST = 2


def combine_phases(phases: Iterable[Phase]) -> Phase:
    """The phase of an operator's result from its inputs' phases (the later one wins)."""
    return max(phases, default=Phase.INVARIANT)
