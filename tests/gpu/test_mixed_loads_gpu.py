"""A for-loop tile read by a ``tl.dot`` and by another operator, on a real GPU: the
RMSNorm + projection kernel of a 512-row prefill (64 x 128 output tiles, K tiles of 64),
whose X tile feeds both X @ W and the sum of squares. With one load of X per iteration,
Triton 3.6's pipelining on an H100 gave wrong elements that changed from run to run (4
warps with 2 or 4 stages, 8 warps: benchmarks/RESULTS.md, fourteenth session); with the
second load (``CodegenOptions.split_mixed_loads``, the default) every setting must agree
with the reference semantics and give the same bits on every run. Skipped without CUDA (or
with TRITON_INTERPRET set)."""

from __future__ import annotations

import pytest
import torch

import mugraph
from mugraph.codegen.check import check_against_reference, random_inputs
from mugraph.codegen.launch import LaunchConfig
from mugraph.codegen.loader import interpreter_active
from mugraph.ir.ops import OpKind
from mugraph.runtime.compiled import compile_graph

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreter_active(), reason="needs a CUDA GPU"
)


def norm_projection(m=512, k=2048, n=3072, m_tile=64, n_tile=128, k_tile=64):
    """rms_norm(X) @ W as one kernel: X @ W and rms(X) accumulated in one for-loop over K."""
    g = mugraph.new_kernel_graph()
    x = g.new_input(dims=(m, k), dtype=mugraph.float16)
    w = g.new_input(dims=(k, n), dtype=mugraph.float16)
    tb = mugraph.new_threadblock_graph((m // m_tile, n // n_tile, 1), (128, 1, 1), k // k_tile)
    tx = tb.new_input(x, (0, -1, -1), forloop_dim=1)
    tw = tb.new_input(w, (-1, 1, -1), forloop_dim=0)
    out = tb.div(tb.forloop_accum(tb.matmul(tx, tw)), tb.forloop_accum(tx, "rms"))
    tb.new_output(out, (0, 1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return g


@pytest.mark.parametrize("warps, stages", [(4, 4), (4, 2), (8, 4), (4, 3)])
def test_a_mixed_loop_tile_computes_right_and_the_same_every_run(warps, stages):
    graph = norm_projection()
    index = next(i for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED)
    program = compile_graph(graph, cuda_graph=False, check=False,
                            launch={index: LaunchConfig(warps, stages)})
    assert 'eviction_policy="evict_last"' in program.source  # the second load is there
    for seed in range(3):
        check_against_reference(graph, program, seed=seed, scale=1.0)
    inputs = random_inputs(graph, "cuda", 7)
    first = program(inputs=inputs)[0].clone()
    for _ in range(5):
        assert torch.equal(program(inputs=inputs)[0], first)
