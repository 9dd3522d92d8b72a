"""Generated kernels on a real GPU: float16 at benchmark-like shapes, the profiler and the
tuner. Skipped without CUDA (or with TRITON_INTERPRET set)."""

from __future__ import annotations

import math

import pytest
import torch

import mugraph
from mugraph.codegen.check import check_against_reference
from mugraph.codegen.loader import interpreter_active
from mugraph.runtime.compiled import compile_graph

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreter_active(), reason="needs a CUDA GPU"
)
CUDA = torch.device("cuda")
F16 = mugraph.float16

try:
    from mugraph.library import WORKLOADS
except ImportError:  # pragma: no cover
    WORKLOADS = {}


def _sizes(w):
    rows = [("small", w.small), ("suite", w.suite)]
    rows += [(name, sizes) for name, sizes in w.extra.items()]
    return rows


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_library_workload_on_gpu(name):
    w = WORKLOADS[name]
    for _label, sizes in _sizes(w):
        for build in (w.naive, w.optimized):
            g = build(sizes)
            program = compile_graph(g)
            check_against_reference(g, program, device=CUDA, scale=0.5)


SHAPES = [(16, 4096, 4096, 64), (5, 1000, 384, 8), (128, 512, 256, 4)]


@pytest.mark.parametrize("m,k,n,loops", SHAPES)
def test_rmsnorm_linear_shapes(m, k, n, loops):
    g = mugraph.new_kernel_graph()
    x = g.new_input((m, k), dtype=F16)
    w = g.new_input((k, n), dtype=F16)
    grid = n // 64 if n % 64 == 0 else 1
    tb = mugraph.new_threadblock_graph((grid, 1, 1), (128, 1, 1), loops)
    tx = tb.new_input(x, (-1, -1, -1), 1)
    tw = tb.new_input(w, (1, -1, -1), 0)
    acc = tb.forloop_accum(tb.matmul(tx, tw))
    tb.new_output(tb.div(acc, tb.forloop_accum(tx, "rms")), (1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    check_against_reference(g, compile_graph(g), device=CUDA)


@pytest.mark.parametrize("num_warps,num_stages", [(2, 1), (4, 2), (8, 3), (4, 4)])
def test_launch_variants_agree(num_warps, num_stages):
    w = WORKLOADS["gated_mlp"]
    g = w.optimized(w.suite)
    program = compile_graph(g, num_warps=num_warps, num_stages=num_stages)
    check_against_reference(g, program, device=CUDA, scale=0.5)


def test_every_block_op_in_fp16_at_larger_shapes():
    g = mugraph.new_kernel_graph()
    x = g.new_input((256, 384), dtype=F16)
    y = g.new_input((256, 1), dtype=F16)
    tb = mugraph.new_threadblock_graph((8, 1, 1), (128, 1, 1), 3, 8)
    tx = tb.new_input(x, (0, -1, -1), 1)
    ty = tb.new_input(y, (0, -1, -1), -1)
    outs = [
        tb.forloop_accum(tb.silu(tb.add(tx, ty)), "sum"),
        tb.forloop_accum(tb.gelu(tx), "rms"),
        tb.forloop_accum(tb.clamp(tb.mul(tx, ty), -0.2, 0.3), "sum_todimx"),
        tb.forloop_accum_max(tb.reduction_max(tb.exp(tx), 1)),
        tb.forloop_accum(tb.div(tb.relu(tx), tb.reduction(tb.exp(tx), 1)), "mean"),
        tb.forloop_accum(tb.rms_norm(tb.square(tx))),
    ]
    for o in outs:
        tb.new_output(o, (0, -1, -1))
    for o in g.customized([x, y], tb):
        g.mark_output(o)
    check_against_reference(g, compile_graph(g), device=CUDA)


def test_profiler_and_tuner():
    from mugraph.optimize import optimize_program, profile_program

    w = WORKLOADS["rmsnorm_linear"]
    g = w.optimized(w.suite)
    m = profile_program(compile_graph(g), reps=20)
    assert m.ok and 0 < m.seconds < 1e-2 and len(m.times) == 20
    result = optimize_program(g, reps=10, warmup=2)
    assert math.isfinite(result.seconds) and result.seconds <= result.baseline_seconds
    assert result.trials


def test_graph_call_routes_cuda_tensors_to_compiled_program():
    w = WORKLOADS["gated_mlp"]
    g = w.optimized(w.small)
    xs = [torch.rand(t.dims, device=CUDA, dtype=torch.float16) - 0.5 for t in g.input_types]
    out = g(inputs=xs)[0]
    ref = compile_graph(g)(inputs=xs)[0]
    assert out.is_cuda and torch.equal(out, ref)
    program = compile_graph(g)
    assert program.source.count("@triton.jit") == 1
