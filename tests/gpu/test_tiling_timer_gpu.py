"""The backend's tiling timer on a real GPU (:class:`mugraph.integration.dynamo._TilingTimer`):
a one-kernel μGraph of X @ W is timed, its compilation batched, and the launch setting it
may choose still computes X @ W. Skipped without CUDA (or with TRITON_INTERPRET set)."""

from __future__ import annotations

import math

import pytest
import torch

import mugraph
from mugraph.codegen.launch import LaunchConfig
from mugraph.codegen.loader import interpreter_active
from mugraph.integration import dynamo
from mugraph.ir.ops import OpKind
from mugraph.runtime.compiled import compile_graph

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreter_active(), reason="needs a CUDA GPU"
)
M, K, N = 256, 512, 256


def _program() -> mugraph.KernelGraph:
    g = mugraph.new_kernel_graph()
    x = g.new_input(dims=(M, K), dtype=mugraph.float16)
    w = g.new_input(dims=(K, N), dtype=mugraph.float16)
    g.mark_output(g.matmul(x, w))
    return g


def _one_kernel(m_tile: int = 64, n_tile: int = 64, k_tile: int = 64) -> mugraph.KernelGraph:
    """X @ W as one kernel: a grid of (N / n_tile, M / m_tile) output tiles, each block
    accumulating its tile over a for-loop of K / k_tile steps."""
    g = mugraph.new_kernel_graph()
    x = g.new_input(dims=(M, K), dtype=mugraph.float16)
    w = g.new_input(dims=(K, N), dtype=mugraph.float16)
    tb = mugraph.new_threadblock_graph((N // n_tile, M // m_tile, 1), (128, 1, 1), K // k_tile)
    tx = tb.new_input(x, (-1, 0, -1), forloop_dim=1)
    tw = tb.new_input(w, (1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(tx, tw)), (1, 0, -1))
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g


def _assert_computes_x_at_w(graph) -> None:
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    w = torch.randn(K, N, device="cuda", dtype=torch.float16)
    (out,) = compile_graph(graph, cuda_graph=False)(inputs=[x, w])
    want = x.float() @ w.float()
    err = float((out.float() - want).abs().max() / want.abs().max())
    assert err < 1e-2, err


def test_tiling_timer_times_and_tunes_a_one_kernel_matmul():
    """``timer(graph)`` is a finite positive time in ms; ``precompile`` of a batch does not
    raise; ``runs_right`` finds nothing wrong; ``launch_settings`` returns None or (kernel
    index, LaunchConfig, ms) whose setting, recorded on the graph, still computes X @ W."""
    program, graph = _program(), _one_kernel()
    _assert_computes_x_at_w(graph)  # the default launch: the μGraph is right
    timer = dynamo._TilingTimer(program)
    timer.precompile([graph, _one_kernel(128, 64, 32)])
    ms = timer(graph)
    assert math.isfinite(ms) and ms > 0, ms
    assert timer.runs_right(graph) is None  # the compiled kernel agrees with the reference

    launch = timer.launch_settings(graph)
    if launch is None:
        return  # no setting 5% faster than the default: nothing to apply
    index, config, launch_ms = launch
    assert isinstance(index, int) and isinstance(config, LaunchConfig)
    assert graph.ops[index].kind is OpKind.CUSTOMIZED
    assert math.isfinite(launch_ms) and launch_ms > 0
    graph.launch_settings = {index: config}
    _assert_computes_x_at_w(graph)


def test_launch_grid_times_settings_of_several_tilings_in_one_batch():
    """``launch_grid`` returns, per graph, None or (kernel index, LaunchConfig, ms) faster than
    the default time it was given; a chosen setting, recorded on its graph, still computes
    X @ W. Given a default time of infinity, a setting that runs right is always chosen."""
    program = _program()
    graphs = [_one_kernel(), _one_kernel(128, 128, 64)]
    timer = dynamo._TilingTimer(program)
    found = timer.launch_grid(graphs, [float("inf"), float("inf")])
    assert len(found) == 2 and all(f is not None for f in found), found
    for graph, (index, config, ms) in zip(graphs, found, strict=True):
        assert graph.ops[index].kind is OpKind.CUSTOMIZED and isinstance(config, LaunchConfig)
        assert math.isfinite(ms) and ms > 0
        graph.launch_settings = {index: config}
        _assert_computes_x_at_w(graph)
