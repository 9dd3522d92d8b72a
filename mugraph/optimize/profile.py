"""Timing on a GPU, as the benchmarks time: warm-up, many runs, the median of CUDA-event
times, with the L2 cache flushed before every run (as ``triton.testing.do_bench`` does).

A variant that fails to compile or run scores infinity (its error is kept), so a search over
variants never stops on one bad candidate.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

L2_FLUSH_BYTES = 256 * 1024**2  # larger than any current L2
_FLUSH: dict[str, Any] = {}


@dataclass(frozen=True)
class Measurement:
    """The median time of a callable in seconds (inf when it failed), and every run's time."""

    seconds: float
    times: tuple[float, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def microseconds(self) -> float:
        return self.seconds * 1e6


def _flush_buffer(device) -> Any:
    import torch

    key = str(device)
    if key not in _FLUSH:
        _FLUSH[key] = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return _FLUSH[key]


def profile_callable(
    fn: Callable[[], Any],
    *,
    warmup: int = 10,
    reps: int = 100,
    flush_l2: bool = True,
    device: Any = "cuda",
) -> Measurement:
    """Time ``fn()`` on the current CUDA device; inf with the error if it raises."""
    import torch

    if not torch.cuda.is_available():
        return Measurement(float("inf"), error="no CUDA device to profile on")
    try:
        _warm_up(fn, warmup)
        flush = _flush_buffer(device) if flush_l2 else None
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends, strict=True):
            if flush is not None:
                flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - a failing variant scores infinity
        return Measurement(float("inf"), error=f"{type(error).__name__}: {error}")
    times = tuple(s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends, strict=True))
    return Measurement(statistics.median(times), times)


def profile_loop(fn: Callable[[], Any], *, warmup: int = 10, reps: int = 200) -> Measurement:
    """Seconds per call of ``fn()`` called back to back with no flush and no synchronisation
    in between (wall clock over all calls, then one synchronisation): the larger of the host's
    time per call (Python, launches) and the device's. Inf with the error if it raises."""
    import time

    import torch

    if not torch.cuda.is_available():
        return Measurement(float("inf"), error="no CUDA device to profile on")
    try:
        _warm_up(fn, warmup)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / reps
    except Exception as error:  # noqa: BLE001
        return Measurement(float("inf"), error=f"{type(error).__name__}: {error}")
    return Measurement(seconds, (seconds,))


def profile_program(
    program,
    inputs: Sequence[Any] | None = None,
    *,
    warmup: int = 10,
    reps: int = 100,
    flush_l2: bool = True,
    seed: int = 0,
) -> Measurement:
    """Time a compiled program (random inputs of the graph's shapes when none are given)."""
    import torch

    if not torch.cuda.is_available():
        return Measurement(float("inf"), error="no CUDA device to profile on")
    try:
        if inputs is None:
            from mugraph.codegen.check import random_inputs

            inputs = random_inputs(program.graph, torch.device("cuda"), seed)
        args = list(inputs)
    except Exception as error:  # noqa: BLE001
        return Measurement(float("inf"), error=f"{type(error).__name__}: {error}")
    return profile_callable(
        lambda: program(inputs=args), warmup=warmup, reps=reps, flush_l2=flush_l2
    )


def _warm_up(fn: Callable[[], Any], warmup: int) -> None:
    """Call ``fn`` ``warmup`` times (at least once: compilation, caches) and wait for it."""
    import torch

    for _ in range(max(1, warmup)):
        fn()
    torch.cuda.synchronize()
