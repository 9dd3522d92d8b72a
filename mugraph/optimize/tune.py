"""Choosing, per kernel, the variant of a compiled μGraph that runs fastest.

Variants never change what a kernel computes: Triton's ``num_warps`` and ``num_stages``, and
whether loop-invariant tiles are loaded once before the for-loop or in every iteration
(register pressure against reloads). Kernels are tuned one after the other (coordinate
descent: the others keep their best variant so far), each variant timed on the whole program.
Without a GPU the program keeps its default variants.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mugraph.ir.graph import BlockGraph
from mugraph.optimize.profile import Measurement, profile_program

WARPS = (2, 4, 8)
STAGES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Variant:
    """One way to run one kernel."""

    num_warps: int
    num_stages: int
    hoist_invariants: bool = True


@dataclass
class Trial:
    op_index: int
    variant: Variant
    measurement: Measurement


@dataclass
class TuneResult:
    """The best program found, its time, the default program's time and every trial."""

    program: Any
    seconds: float
    baseline_seconds: float
    trials: list[Trial] = field(default_factory=list)
    note: str = ""


def _has_invariant_loop_inputs(block: BlockGraph) -> bool:
    return block.forloop_range > 1 and any(op.attr("forloop_dim") < 0 for op in block.input_ops)


def candidate_variants(block: BlockGraph) -> list[Variant]:
    """Every variant worth timing for a kernel made from ``block``."""
    hoists = (True, False) if _has_invariant_loop_inputs(block) else (True,)
    stages = STAGES if block.forloop_range > 1 else (1, 2)
    return [Variant(w, s, h) for w, s, h in itertools.product(WARPS, stages, hoists)]


def _apply(program, op_index: int, variant: Variant):
    from mugraph.runtime.compiled import LaunchConfig

    options = replace(program.steps[op_index].options, hoist_invariants=variant.hoist_invariants)
    launch = LaunchConfig(variant.num_warps, variant.num_stages)
    return program.with_config(op_index, launch, options)


def optimize_program(
    graph,
    inputs: Sequence[Any] | None = None,
    *,
    warmup: int = 5,
    reps: int = 30,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
) -> TuneResult:
    """Compile ``graph`` and pick the fastest variant of each kernel by profiling on a GPU."""
    import torch

    from mugraph.runtime.compiled import compile_graph

    program = compile_graph(graph)
    if not torch.cuda.is_available():
        return TuneResult(program, float("nan"), float("nan"), note="no GPU: default variants")
    if inputs is None:
        from mugraph.codegen.check import random_inputs

        inputs = random_inputs(graph, torch.device("cuda"))
    best = profile_program(program, inputs, warmup=warmup, reps=reps)
    result = TuneResult(program, best.seconds, best.seconds)
    for op_index, step in list(program.steps.items()):
        for variant in candidate_variants(step.block):
            try:
                candidate = _apply(result.program, op_index, variant)
            except Exception as error:  # noqa: BLE001 - a variant that fails scores infinity
                m = Measurement(float("inf"), error=f"{type(error).__name__}: {error}")
            else:
                m = profile_program(candidate, inputs, warmup=warmup, reps=reps)
            result.trials.append(Trial(op_index, variant, m))
            if progress:
                progress(f"{step.label} {variant}: {m.microseconds:.1f} us")
            if m.seconds < result.seconds:
                result.program, result.seconds = candidate, m.seconds
    if check:
        from mugraph.codegen.check import check_against_reference

        check_against_reference(graph, result.program)
    return result
