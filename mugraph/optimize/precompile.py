"""Compiling many program variants at once, in worker processes.

Triton compiles a kernel in one thread, taking a good part of a second; the tuner and the
benchmarks try dozens of variants. :func:`precompile` hands the variants to a pool of worker
processes, each of which runs its program once on random inputs of the right shapes (so the
kernels are specialised exactly as they will be called), which leaves the compiled kernels in
Triton's on-disk cache; this process then loads them from there instead of compiling.

Only on CUDA and only where it pays (more than one program, more than one CPU); otherwise
it does nothing and the kernels compile on first use, as always.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence
from typing import Any

_POOL: dict[str, Any] = {}


def default_jobs() -> int:
    env = os.environ.get("MUGRAPH_COMPILE_JOBS")
    if env:
        return max(1, int(env))
    return max(1, min(16, (os.cpu_count() or 1) - 1))


def _pool(jobs: int):
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    pool = _POOL.get("pool")
    if pool is None or _POOL.get("jobs") != jobs:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"))
        _POOL.update(pool=pool, jobs=jobs)
    return pool


def shutdown() -> None:
    pool = _POOL.pop("pool", None)
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


atexit.register(shutdown)


def _compile_one(payload) -> str | None:
    """Worker: build the program, run it once (compiling its kernels), report any error."""
    graph, options, configs, kernel_options, seed = payload
    try:
        import torch

        from mugraph.codegen.check import random_inputs
        from mugraph.runtime.compiled import CompiledProgram

        program = CompiledProgram(graph, options, configs, kernel_options, cuda_graph=False)
        inputs = random_inputs(graph, torch.device("cuda"), seed)
        program.run_values(inputs)
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - reported, the caller scores it
        return f"{type(error).__name__}: {str(error)[:300]}"
    return None


def precompile(programs: Sequence[Any], *, jobs: int | None = None, seed: int = 0) -> list:
    """Compile the kernels of ``programs`` (CompiledProgram) in parallel; each program's error
    text or None. A no-op (all None) without CUDA, under the interpreter, or with one job."""
    results: list = [None] * len(programs)
    jobs = default_jobs() if jobs is None else jobs
    if jobs <= 1 or len(programs) <= 1:
        return results
    try:
        import torch

        from mugraph.codegen.loader import interpreter_active

        if not torch.cuda.is_available() or interpreter_active():
            return results
        payloads = [
            (p.graph, p.options, p.launch_configs, p.kernel_options, seed) for p in programs
        ]
        return list(_pool(jobs).map(_compile_one, payloads))
    except Exception as error:  # noqa: BLE001 - the pool is an optimisation only
        shutdown()
        return [f"precompile failed: {type(error).__name__}: {error}"] * len(programs)
