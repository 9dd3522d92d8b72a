"""The μGraph optimizer (paper §6): choose how a compiled μGraph runs without changing what it
computes — launch configurations (num_warps, num_stages) and codegen choices (hoisting of
loop-invariant loads) — by profiling on a GPU, and rank μGraphs without one by a cost model.
"""

from mugraph.optimize.cost_model import Cost, KernelCost, estimate
from mugraph.optimize.precompile import precompile
from mugraph.optimize.profile import Measurement, profile_callable, profile_loop, profile_program
from mugraph.optimize.tune import (
    TuneResult,
    Variant,
    candidate_variants,
    optimize_graphs,
    optimize_program,
)

__all__ = [
    "Cost",
    "KernelCost",
    "Measurement",
    "Variant",
    "candidate_variants",
    "estimate",
    "TuneResult",
    "optimize_graphs",
    "optimize_program",
    "precompile",
    "profile_callable",
    "profile_loop",
    "profile_program",
]
