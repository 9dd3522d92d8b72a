"""Choosing how a row's μGraph runs, on the GPU, with every choice checked against PyTorch.

:func:`screen` times each candidate μGraph of a row (the search's verified alternatives, or
the hand-written μGraph's tilings) with default launch settings, after comparing its output
with the float32 PyTorch reference: a candidate that disagrees (a code-generation problem the
verifier cannot see) is dropped, not chosen. :func:`launch_variants` and :func:`tune_rows`
then try a few launch settings per kernel for many rows at once: all variants are compiled in
one batch of worker processes (``mugraph.optimize.precompile``), each kernel's variants are
timed with the other kernels at their defaults, and the best of each kernel are combined and
checked again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mugraph.optimize import profile_callable
from mugraph.runtime.compiled import LaunchConfig, compile_graph, max_warps

WARPS = (1, 2, 4, 8)
STAGES = (2, 3, 4)


@dataclass
class Screened:
    """One candidate's outcome: its program, time (None: not timed) and why not."""

    label: str
    program: object | None
    us: float | None = None
    note: str = ""


# what CUDA reports when a kernel faults; the process's CUDA context is lost after it
FAULT_MARKERS = ("illegal memory access", "unspecified launch failure", "misaligned address",
                 "illegal instruction")
EXCLUDED_NOTE = "excluded: faulted the GPU in an earlier attempt"


class CudaFault(Exception):
    """A candidate's kernel faulted: nothing more can run on the GPU in this process."""

    def __init__(self, label: str, error: object) -> None:
        super().__init__(f"{label}: {error}")
        self.label = label


def is_cuda_fault(error: object) -> bool:
    text = str(error).lower()
    return any(marker in text for marker in FAULT_MARKERS)


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:100] if str(error) else ''}"


def screen(candidates, inputs, check: Callable[[object], float], tolerance: float,
           reps: int, exclude: frozenset[str] = frozenset()) -> list[Screened]:
    """Each (label, graph) compiled (no reference check of its own: ``check`` compares its
    output with PyTorch and returns the relative error), checked, and timed. Labels in
    ``exclude`` are skipped; a candidate that faults the GPU raises :class:`CudaFault`."""
    out = []
    for label, graph in candidates:
        if label in exclude:
            out.append(Screened(label, None, note=EXCLUDED_NOTE))
            continue
        try:
            program = compile_graph(graph, check=False)
            err = check(program)
        except Exception as error:  # noqa: BLE001 - a candidate that fails is dropped
            if is_cuda_fault(error):
                raise CudaFault(label, error) from error
            out.append(Screened(label, None, note=_short(error)))
            continue
        if not err < tolerance:
            out.append(Screened(label, None, note=f"MISMATCH rel err {err:.3g}"))
            continue
        m = profile_callable(lambda p=program: p(inputs=inputs), warmup=5, reps=reps)
        if not m.ok and is_cuda_fault(m.error):
            raise CudaFault(label, m.error)
        out.append(Screened(label, program, m.microseconds if m.ok else None,
                            "" if m.ok else f"timing failed: {m.error}"))
    return out


def launch_variants(program, op_index: int) -> list:
    """A few launch settings of one kernel besides its default: every warp count (16 too
    for large tiles, none over ``max_warps``) at the default pipeline depth, and for a
    pipelined for-loop 2-4 stages at the default warps. Programs, not yet compiled."""
    from mugraph.codegen.triton_gen import unrolled

    step = program.steps[op_index]
    base = step.launch_config
    largest = max((t.num_elements for op in step.block.ops for t in op.outputs), default=1)
    warps = WARPS + ((16,) if largest >= 16384 else ())
    warps = tuple(w for w in warps if w <= max_warps(step.block))
    configs = [LaunchConfig(w, base.num_stages) for w in warps if w != base.num_warps]
    if step.block.forloop_range > 1 and not unrolled(step.block, step.options):
        configs += [LaunchConfig(base.num_warps, s) for s in STAGES if s != base.num_stages]
    return [program.with_config(op_index, config) for config in configs]


@dataclass
class RowTuning:
    """A row's program and the variants tried for each of its kernels."""

    key: str
    program: object
    run: Callable[[object], object]  # program -> output tensor
    variants: dict[int, list] = field(default_factory=dict)


def tune_rows(rows: list[RowTuning], check: Callable[[str, object], float], tolerance: float,
              reps: int, log: Callable[[str], None] = print) -> dict[str, tuple]:
    """Tune every row's kernels at once; {key: (program, us, default us)} for the rows whose
    tuned program agrees with the reference (``check(key, program)`` is its relative error)."""
    from mugraph.optimize import precompile

    for row in rows:
        row.variants = {i: launch_variants(row.program, i) for i in row.program.steps}
    batch = [v for row in rows for vs in row.variants.values() for v in vs]
    errors = [e for e in precompile(batch) if e]
    log(f"compiled {len(batch)} launch variants of {len(rows)} rows"
        + (f" ({len(errors)} failed: {errors[0][:100]})" if errors else ""))
    results = {}
    for row in rows:
        try:
            results[row.key] = _tune_one(row, check, tolerance, reps)
        except Exception as error:  # noqa: BLE001 - the row keeps its default program
            log(f"tuning {row.key} failed: {_short(error)}")
    return results


def _time(row: RowTuning, program, reps: int) -> float | None:
    m = profile_callable(lambda: row.run(program), warmup=5, reps=reps)
    return m.microseconds if m.ok else None


def _tune_one(row: RowTuning, check, tolerance: float, reps: int) -> tuple:
    default = _time(row, row.program, reps)
    chosen = {}
    for op_index, variants in row.variants.items():
        best, best_time = None, default
        for variant in variants:
            try:
                if not check(row.key, variant) < tolerance:
                    continue
            except Exception:  # noqa: BLE001, S112 - a variant that fails is skipped
                continue
            t = _time(row, variant, reps)
            if t is not None and (best_time is None or t < best_time):
                best, best_time = variant, t
        if best is not None:
            chosen[op_index] = best.steps[op_index]
    program = row.program
    for op_index, step in chosen.items():
        program = program.with_config(op_index, step.launch_config,
                                      replace(step.options))
    if not chosen or not check(row.key, program) < tolerance:
        return row.program, default, default
    return program, _time(row, program, reps), default
