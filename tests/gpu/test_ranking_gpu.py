"""Ranking on a real GPU: candidates measured and the fastest returned, launch settings kept,
and a kernel that faults the GPU (an illegal address) excluded while the caller's process and
the other candidates go on. Skipped without CUDA (or with TRITON_INTERPRET set)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import mugraph as mi
from mugraph.codegen.loader import interpreter_active
from mugraph.library import WORKLOADS
from mugraph.optimize.ranking import (
    PROGRAM_LABEL,
    Entry,
    RankingOptions,
    profile_timer,
    rank_graphs,
)
from mugraph.runtime.compiled import compile_graph

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreter_active(), reason="needs a CUDA GPU"
)
SIZES = {"m": 8, "k": 1024, "n": 2048}
TILINGS = [{"k_tile": 128, "n_tile": 64}, {"k_tile": 256, "n_tile": 32},
           {"k_tile": 64, "n_tile": 128}]


def tiling_entries():
    w = WORKLOADS["rmsnorm_linear"]
    program = w.naive(SIZES)
    entries = []
    for i, tiles in enumerate(TILINGS):
        graph = w.optimized({**SIZES, **tiles})
        entries.append(Entry(f"#{i}", graph, (i + 1) * 1e-6))
    return program, entries


def test_rank_graphs_measures_every_candidate_and_returns_the_fastest():
    program, entries = tiling_entries()
    result = rank_graphs(program, entries, RankingOptions(reps=30, tune_top=1, seed=0))
    assert result.method == "gpu" and result.device
    timed = [r for r in result.records if r.status == "timed"]
    assert len(timed) == len(entries)
    assert all(r.default_us > 0 and r.launch for r in timed)
    fastest = min(timed, key=lambda r: r.measured_us)
    assert result.chosen in (fastest.label, PROGRAM_LABEL)
    assert result.program_us and result.program_us > 0
    assert any(r.tuned_us for r in timed) or any("default launch stayed" in n
                                                 for r in timed for n in r.notes)
    print(result.summary())
    print(result.table())


class FaultingTimer:
    """Times with the GPU timer, but for ``label`` first launches a kernel that stores to
    an address far outside any allocation: a real illegal memory access in the worker."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __call__(self, run, subject):
        if subject.label == self.label:
            _wild_store()
        return profile_timer(run, subject)


def _wild_store() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def wild(ptr):
        offset = tl.full((), 1 << 40, tl.int64)
        tl.store(ptr + offset, 1.0)

    x = torch.zeros(16, device="cuda")
    wild[(1,)](x)
    torch.cuda.synchronize()


def test_a_candidate_faulting_the_gpu_is_excluded_and_the_rest_ranked():
    program, entries = tiling_entries()
    options = RankingOptions(reps=20, tune_top=0, seed=1, timer=FaultingTimer("#1"))
    result = rank_graphs(program, entries, options)
    (bad,) = result.excluded
    assert bad.label == "#1"
    assert "faulted the GPU" in bad.reason or "worker process died" in bad.reason
    assert {r.label for r in result.records if r.status == "timed"} == {"#0", "#2"}
    # this process's CUDA context was never touched by the fault
    assert float((torch.ones(4, device="cuda") * 2).sum()) == 8.0
    print(result.summary())


@pytest.mark.skipif(importlib.util.find_spec("egglog") is None, reason="needs egglog")
def test_superoptimize_on_the_gpu_returns_a_measured_choice():
    g = mi.new_kernel_graph()
    x = g.new_input((8, 512), dtype=mi.float16)
    w = g.new_input((512, 1024), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(x, 512), w))
    best = g.superoptimize(time_limit=30, workers=8, max_custom_kernels=1,
                           ranking={"reps": 30, "tune_top": 1})
    ranking = best.ranking
    assert ranking is not None and ranking.method == "gpu"
    assert ranking.chosen is not None
    print(ranking.summary())
    if best is g:
        return  # the program itself measured fastest
    program = compile_graph(best)
    assert program.launch_configs == {i: c for i, c in best.launch_settings.items()}
    xs = [torch.randn(8, 512, device="cuda", dtype=torch.float16),
          torch.randn(512, 1024, device="cuda", dtype=torch.float16) / 16]
    (out,) = best(inputs=xs)
    ref = torch.nn.functional.rms_norm(xs[0].float(), (512,)) @ xs[1].float()
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2)
