"""RMSNorm followed by a linear layer: O = rms_norm(X) @ W (X 8x256, W 256x128, float16).

The search finds the one-kernel μGraph that accumulates rms(X) beside X @ W in the for-loop
and divides once at the end (the normalisation scales rows, so it commutes with the matmul).

    mugraph optimize examples/programs/rmsnorm_linear.py --time-limit 60
"""

from __future__ import annotations

import mugraph

M, K, N = 8, 256, 128


def program() -> mugraph.KernelGraph:
    """The naive program, as a user writes it."""
    graph = mugraph.new_kernel_graph()
    x = graph.new_input((M, K), dtype=mugraph.float16)
    w = graph.new_input((K, N), dtype=mugraph.float16)
    graph.mark_output(graph.matmul(graph.rms_norm(x, K), w))
    return graph
