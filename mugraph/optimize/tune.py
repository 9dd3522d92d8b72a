"""Choosing the variant of a compiled μGraph that runs fastest, by timing them on the GPU.

Variants never change what a kernel computes: Triton's ``num_warps`` and ``num_stages``,
whether loop-invariant tiles are loaded once before the for-loop or in every iteration
(register pressure against reloads), and whether a short for-loop is unrolled (all its loads
issued at once) or left to Triton's software pipelining. Kernels are tuned one after the other
(coordinate descent: the others keep their best variant so far); every variant of a kernel is
compiled up front in worker processes (:mod:`mugraph.optimize.precompile`), then each is timed
on the whole program (:func:`~mugraph.optimize.profile.profile_program`: warm-up, many runs,
median, L2 flushed) after its outputs are compared with the default program's. A variant that
fails to compile, to run, or to agree scores infinity. Without a GPU the program keeps its
default variants.

:func:`optimize_graphs` does the same over several μGraphs of one function (say, the library's
tile-size variants of a workload): each is timed with its default variants first, then the
fastest few are tuned and the fastest of all is returned.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mugraph.ir.graph import BlockGraph
from mugraph.optimize.profile import Measurement, profile_program

WARPS = (1, 2, 4, 8)
STAGES = (2, 3, 4, 5, 6)
MAX_UNROLL = 64  # longest for-loop that may be unrolled
MISMATCH_TOLERANCE = 2e-2  # tolerance for dtypes the reference check does not list


@dataclass(frozen=True)
class Variant:
    """One way to run one kernel."""

    num_warps: int
    num_stages: int
    hoist_invariants: bool = True
    unroll: bool = False


@dataclass
class Trial:
    op_index: int
    variant: Variant
    measurement: Measurement
    label: str = ""


@dataclass
class TuneResult:
    """The best program found, its time, the default program's time and every trial."""

    program: Any
    seconds: float
    baseline_seconds: float
    trials: list[Trial] = field(default_factory=list)
    note: str = ""
    label: str = ""  # which candidate graph (optimize_graphs)
    graph: Any = None
    screen: list[tuple[str, Measurement]] = field(default_factory=list)

    @property
    def variants(self) -> dict[int, Variant]:
        """The chosen variant of every kernel of the best program."""
        from mugraph.codegen.triton_gen import unrolled

        return {
            i: Variant(s.launch_config.num_warps, s.launch_config.num_stages,
                       s.options.hoist_invariants, unrolled(s.block, s.options))
            for i, s in self.program.steps.items()
        }


def _has_invariant_loop_inputs(block: BlockGraph) -> bool:
    return block.forloop_range > 1 and any(op.attr("forloop_dim") < 0 for op in block.input_ops)


def _largest_tile(block: BlockGraph) -> int:
    return max((t.num_elements for op in block.ops for t in op.outputs), default=1)


def candidate_variants(block: BlockGraph) -> list[Variant]:
    """Every variant worth timing for a kernel made from ``block``.

    Without a for-loop the pipeline depth changes nothing (one stage); an unrolled loop is
    not pipelined either. Sixteen warps are tried for very large tiles only, and never more
    than :func:`~mugraph.runtime.compiled.max_warps`.
    """
    from mugraph.runtime.compiled import max_warps

    warps = WARPS + ((16,) if _largest_tile(block) >= 16384 else ())
    warps = tuple(w for w in warps if w <= max_warps(block))
    hoists = (True, False) if _has_invariant_loop_inputs(block) else (True,)
    if block.forloop_range <= 1:
        return [Variant(w, 1) for w in warps]
    loops = [(s, False) for s in STAGES]
    if block.forloop_range <= MAX_UNROLL:
        loops.append((1, True))
    return [Variant(w, s, h, u) for w, (s, u), h in itertools.product(warps, loops, hoists)]


# 1: no software pipelining, so a streamed tile is a plain load with its evict-first hint
# (Triton's asynchronous copies for pipelined dot operands drop it)
QUICK_STAGES = (1, 2, 3, 4)


def launch_variants(block: BlockGraph, base) -> list:
    """A few launch settings (:class:`~mugraph.runtime.compiled.LaunchConfig`) of one kernel
    besides ``base``, for quick tuning: every warp count (16 too for very large tiles, none
    over :func:`~mugraph.runtime.compiled.max_warps`) at ``base``'s pipeline depth, and for a
    pipelined for-loop 1-4 stages at ``base``'s warps. Codegen choices (``base``'s GEMV form
    among them) are left as they are."""
    from mugraph.runtime.compiled import max_warps

    warps = WARPS + ((16,) if _largest_tile(block) >= 16384 else ())
    warps = tuple(w for w in warps if w <= max_warps(block))
    configs = [replace(base, num_warps=w) for w in warps if w != base.num_warps]
    if _pipelined(block):
        configs += [replace(base, num_stages=s) for s in QUICK_STAGES if s != base.num_stages]
    return configs


def _pipelined(block: BlockGraph) -> bool:
    """Whether the kernel's for-loop is software-pipelined (its stage count matters)."""
    from mugraph.codegen.triton_gen import auto_unroll

    return block.forloop_range > 1 and not auto_unroll(block)


# The settings tilings are compared with: a kernel's best warp count depends on its tiles,
# which the default launch reads only roughly (it keeps 4 warps for a kernel with a matmul).
GRID_WARPS = (4, 8)
GRID_STAGES = (2, 3, 4)


def launch_grid(block: BlockGraph, base) -> list:
    """The launch settings of one kernel besides ``base`` to time before tilings are compared:
    GRID_WARPS warps (none over :func:`~mugraph.runtime.compiled.max_warps`) times GRID_STAGES
    pipeline stages for a pipelined for-loop, ``base``'s stages otherwise. Unlike
    :func:`launch_variants` (a sweep around ``base``) it tries warps and stages together:
    for a Llama-1B gated MLP of 512 rows, tiles of 128 x 128 ran in 0.2655 ms with the default
    launch (4 warps, 4 stages) and in 0.0790 ms with 8 warps and 3 stages, faster than any
    other tiling (``benchmarks/RESULTS.md``, sixteenth session). Codegen choices (``base``'s
    GEMV form among them) are left as they are."""
    from mugraph.runtime.compiled import max_warps

    stages = GRID_STAGES if _pipelined(block) else (base.num_stages,)
    configs = [replace(base, num_warps=w, num_stages=s)
               for w in GRID_WARPS if w <= max_warps(block) for s in stages]
    return [c for c in configs if c != base]


def _apply(program, op_index: int, variant: Variant):
    from mugraph.runtime.compiled import LaunchConfig

    options = replace(
        program.steps[op_index].options,
        hoist_invariants=variant.hoist_invariants,
        unroll=variant.unroll,
    )
    launch = LaunchConfig(variant.num_warps, variant.num_stages)
    return program.with_config(op_index, launch, options)


def _outputs(program, inputs) -> list:
    import torch

    outs = program(inputs=inputs)
    torch.cuda.synchronize()
    return [o.detach().clone() for o in outs]


def disagreement(outs, ref) -> str | None:
    """Why ``outs`` differs from ``ref`` (elementwise, with the reference check's tolerances
    for the dtype: |out - ref| <= atol * rms(ref) + rtol * |ref|; NaNs where ref has them), or
    None."""
    from mugraph.codegen.check import TOLERANCES, compare
    from mugraph.dtypes import DType

    for k, (o, r) in enumerate(zip(outs, ref, strict=True)):
        dtype = DType(str(r.dtype).removeprefix("torch."))
        rtol, atol = TOLERANCES.get(dtype, (MISMATCH_TOLERANCE, MISMATCH_TOLERANCE))
        cmp = compare(o.detach().double().cpu().numpy(), r.detach().double().cpu().numpy(),
                      rtol, atol)
        if not cmp.ok:
            return (f"output {k}: {cmp.max_rel_error:.3g}x the tolerance at {cmp.worst_index} "
                    f"({cmp.nonfinite_mismatch} non-finite mismatches) against the default")
    return None


def _measure(program, inputs, reference, warmup: int, reps: int) -> Measurement:
    try:
        problem = disagreement(_outputs(program, inputs), reference) if reference else None
    except Exception as error:  # noqa: BLE001 - a variant that fails scores infinity
        return Measurement(float("inf"), error=f"{type(error).__name__}: {error}")
    if problem:
        return Measurement(float("inf"), error=f"mismatch: {problem}")
    return profile_program(program, inputs, warmup=warmup, reps=reps)


def _tune(
    result: TuneResult,
    inputs,
    reference,
    *,
    warmup: int,
    reps: int,
    jobs: int | None,
    progress: Callable[[str], None] | None,
    deadline: float | None = None,
) -> TuneResult:
    """Coordinate descent over the kernels of ``result.program``, in place; no kernel is
    started once ``time.perf_counter()`` has passed ``deadline``."""
    from mugraph.optimize.precompile import precompile

    for op_index, step in list(result.program.steps.items()):
        if deadline is not None and time.perf_counter() > deadline:
            result.note = "tuning stopped at its deadline"
            break
        variants = candidate_variants(step.block)
        candidates = []
        for variant in variants:
            try:
                candidates.append(_apply(result.program, op_index, variant))
            except Exception as error:  # noqa: BLE001 - a variant that fails scores infinity
                candidates.append(error)
        precompile([c for c in candidates if not isinstance(c, Exception)], jobs=jobs)
        for variant, candidate in zip(variants, candidates, strict=True):
            # once compiled, every variant of this kernel is timed (tens of ms each): the
            # deadline only keeps the next kernel from starting
            if isinstance(candidate, Exception):
                m = Measurement(float("inf"), error=f"{type(candidate).__name__}: {candidate}")
            else:
                m = _measure(candidate, inputs, reference, warmup, reps)
            result.trials.append(Trial(op_index, variant, m, result.label))
            if progress:
                progress(f"{result.label} {step.label} {variant}: {m.microseconds:.1f} us")
            if m.seconds < result.seconds:
                result.program, result.seconds = candidate, m.seconds
    return result


def _cuda_inputs(graph, inputs):
    import torch

    if inputs is not None:
        return list(inputs)
    from mugraph.codegen.check import random_inputs

    return random_inputs(graph, torch.device("cuda"))


def optimize_program(
    graph,
    inputs: Sequence[Any] | None = None,
    *,
    warmup: int = 5,
    reps: int = 30,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
    jobs: int | None = None,
    cuda_graph: bool | None = None,
    deadline: float | None = None,
) -> TuneResult:
    """Compile ``graph`` and pick the fastest variant of each kernel by profiling on a GPU.

    jobs: worker processes compiling variants ahead (None: one per CPU, 1: none).
    deadline: a ``time.perf_counter()`` value after which the best so far is kept.
    check: compare the chosen program with the reference semantics at the end.
    """
    import torch

    from mugraph.runtime.compiled import compile_graph

    program = compile_graph(graph, cuda_graph=cuda_graph)
    if not torch.cuda.is_available():
        return TuneResult(program, float("nan"), float("nan"), note="no GPU: default variants",
                          graph=graph)
    inputs = _cuda_inputs(graph, inputs)
    reference = _outputs(program, inputs)
    best = profile_program(program, inputs, warmup=warmup, reps=reps)
    result = TuneResult(program, best.seconds, best.seconds, graph=graph)
    _tune(result, inputs, reference, warmup=warmup, reps=reps, jobs=jobs, progress=progress,
          deadline=deadline)
    if check:
        from mugraph.codegen.check import check_against_reference

        check_against_reference(graph, result.program, scale=0.5)
    return result


def optimize_graphs(
    candidates: Sequence[tuple[str, Any]],
    inputs: Sequence[Any] | None = None,
    *,
    keep: int = 2,
    warmup: int = 5,
    reps: int = 30,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
    jobs: int | None = None,
    cuda_graph: bool | None = None,
    deadline: float | None = None,
    budget: float | None = None,
) -> TuneResult:
    """The fastest of several μGraphs computing one function (``(label, graph)`` pairs with the
    same inputs), each tuned as :func:`optimize_program` does: all are timed with their
    default variants, the ``keep`` fastest are tuned, the fastest tuned one is returned (its
    ``label``, ``graph`` and ``screen``: every candidate's default time). Tuning stops at
    ``deadline`` (a ``time.perf_counter()`` value) or ``budget`` seconds after the screening."""
    import torch

    from mugraph.optimize.precompile import precompile
    from mugraph.runtime.compiled import compile_graph

    if not candidates:
        raise ValueError("optimize_graphs needs at least one candidate graph")
    if not torch.cuda.is_available():
        label, graph = candidates[0]
        program = compile_graph(graph, cuda_graph=cuda_graph)
        return TuneResult(program, float("nan"), float("nan"), note="no GPU: default variants",
                          label=label, graph=graph)
    inputs = _cuda_inputs(candidates[0][1], inputs)
    programs, screen, reference = [], [], None
    for _, graph in candidates:
        try:
            programs.append(compile_graph(graph, cuda_graph=cuda_graph))
        except Exception as error:  # noqa: BLE001 - an unsupported candidate is skipped
            programs.append(error)
    precompile([p for p in programs if not isinstance(p, Exception)], jobs=jobs)
    results = []
    for (label, graph), program in zip(candidates, programs, strict=True):
        if isinstance(program, Exception):
            m = Measurement(float("inf"), error=f"{type(program).__name__}: {program}")
        elif reference is None:
            try:
                reference = _outputs(program, inputs)
            except Exception as error:  # noqa: BLE001
                m = Measurement(float("inf"), error=f"{type(error).__name__}: {error}")
            else:
                m = profile_program(program, inputs, warmup=warmup, reps=reps)
        else:
            m = _measure(program, inputs, reference, warmup, reps)
        screen.append((label, m))
        if progress:
            progress(f"screen {label}: {m.microseconds:.1f} us")
        if math.isfinite(m.seconds):
            results.append(TuneResult(program, m.seconds, m.seconds, label=label, graph=graph))
    if not results:
        errors = "; ".join(f"{label}: {m.error}" for label, m in screen)
        raise RuntimeError(f"optimize_graphs: no candidate ran ({errors})")
    results.sort(key=lambda r: r.seconds)
    if budget is not None:
        after = time.perf_counter() + budget
        deadline = after if deadline is None else min(deadline, after)
    best = None
    for result in results[: max(1, keep)]:
        _tune(result, inputs, reference, warmup=warmup, reps=reps, jobs=jobs, progress=progress,
              deadline=deadline)
        if best is None or result.seconds < best.seconds:
            best = result
    best.screen = screen
    if check:
        from mugraph.codegen.check import check_against_reference

        check_against_reference(best.graph, best.program, scale=0.5)
    return best
