"""The LLaMA-style block of examples/llama_block.py end to end on a GPU: eager PyTorch,
``torch.compile(backend="inductor")`` and ``torch.compile(backend="mugraph")``.

Checks the mugraph-compiled block against eager (float16 tolerance) and prints the timings
(run with ``-s`` to see them). Skipped without CUDA. Environment knobs:
``MUGRAPH_GPU_TIME_LIMIT`` (search seconds per partition, default 10),
``MUGRAPH_GPU_WORKERS`` (search workers, default 1), ``MUGRAPH_CACHE_DIR`` (result cache;
default: a fresh temporary directory, so the search runs).
"""

from __future__ import annotations

import importlib
import os
import statistics
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def example():
    import sys

    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("llama_block")
    finally:
        sys.path.remove(str(EXAMPLES))


def cuda_time_ms(fn, *args, warmup: int = 5, reps: int = 30) -> float:
    """Median wall time of ``fn(*args)`` on the GPU, in milliseconds."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def first_call_s(fn, *args) -> float:
    started = time.perf_counter()
    with torch.no_grad():
        fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def test_llama_block_end_to_end(example, tmp_path, monkeypatch):
    import mugraph.integration as mgi

    if not os.environ.get("MUGRAPH_CACHE_DIR"):
        monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    time_limit = float(os.environ.get("MUGRAPH_GPU_TIME_LIMIT", "10"))
    workers = int(os.environ.get("MUGRAPH_GPU_WORKERS", "1"))
    cfg = example.SIZES["cuda"]
    block, x = example.make_inputs(cfg, torch.float16, "cuda")
    torch._dynamo.reset()
    mgi.clear_reports()

    inductor = torch.compile(block, backend="inductor", dynamic=False)
    inductor_compile = first_call_s(inductor, x)
    found = example.compile_block(block, time_limit, None, workers=workers)
    found_compile = first_call_s(found, x)
    captured = example.compile_block(block, time_limit, None, workers=workers,
                                     run_unimproved=True)
    captured_compile = first_call_s(captured, x)

    with torch.no_grad():
        want = block(x)
        err = example.relative_error(found(x), want)
        err_all = example.relative_error(captured(x), want)
    for report in mgi.reports():
        print(report.format())
    rows = [
        ("eager", cuda_time_ms(block, x), 0.0),
        ("torch.compile inductor", cuda_time_ms(inductor, x), inductor_compile),
        ("torch.compile mugraph", cuda_time_ms(found, x), found_compile),
        ("mugraph, all captured", cuda_time_ms(captured, x), captured_compile),
    ]
    print(f"\nLLaMA block {cfg} float16 on {torch.cuda.get_device_name()}:")
    print(f"{'':28s}{'ms / call':>12s}{'first call s':>14s}")
    for name, ms, first in rows:
        print(f"{name:28s}{ms:12.3f}{first:14.1f}")
    taken = sum(len(r.taken) for r in mgi.reports())
    print(f"mugraph partitions on mugraph: {taken}; relative error {err:.2e} / {err_all:.2e}")
    assert err <= example.TOLERANCE[torch.float16]
    assert err_all <= example.TOLERANCE[torch.float16]
