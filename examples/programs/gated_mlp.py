"""A gated MLP (as in LLaMA): O = silu(X @ W1) * (X @ W3), small shapes, float16.

The hand-written μGraph (``mugraph.library.gated_mlp_fused``) computes both matmuls and the
gate in one custom kernel; on two cores a two-minute search finds a two-kernel μGraph (both
matmuls in one kernel, the gate fused into a second), about 1.9x faster by the cost model.

    mugraph optimize examples/programs/gated_mlp.py --time-limit 120
"""

from __future__ import annotations

import mugraph

M, K, N = 8, 128, 64


def program() -> mugraph.KernelGraph:
    """The naive program: two matmuls, silu and an elementwise product."""
    graph = mugraph.new_kernel_graph()
    x = graph.new_input((M, K), dtype=mugraph.float16)
    w1 = graph.new_input((K, N), dtype=mugraph.float16)
    w3 = graph.new_input((K, N), dtype=mugraph.float16)
    graph.mark_output(graph.mul(graph.silu(graph.matmul(x, w1)), graph.matmul(x, w3)))
    return graph
