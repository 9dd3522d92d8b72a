"""A first mugraph program: RMSNorm followed by a matmul.

Builds the naive program, the hand-written one-kernel μGraph that computes the same function,
checks them against each other (finite-field verifier when available, then floats), and
prints both graphs.  Run: python examples/quickstart.py
"""

from __future__ import annotations

import numpy as np

import mugraph
from mugraph.library import WORKLOADS


def program() -> mugraph.KernelGraph:
    """The naive program, as a user writes it: O = rms_norm(X) @ W."""
    graph = mugraph.new_kernel_graph()
    x = graph.new_input((8, 512), dtype=mugraph.float16)
    w = graph.new_input((512, 256), dtype=mugraph.float16)
    graph.mark_output(graph.matmul(graph.rms_norm(x, 512), w))
    return graph


def main() -> None:
    naive = program()
    sizes = {"m": 8, "k": 512, "n": 256, "k_tile": 64, "n_tile": 32}
    fused = WORKLOADS["rmsnorm_linear"].optimized(sizes)
    print(naive, end="\n\n")
    print(fused, end="\n\n")
    if hasattr(mugraph, "verify"):
        result = mugraph.verify(fused, naive)
        print(f"finite-field verification: {result}")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(t.dims).astype(np.float16) for t in naive.input_types]
    (a,) = naive(inputs=inputs)
    (b,) = fused(inputs=inputs)
    err = float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(a)))
    print(f"reference semantics: max relative difference {err:.2e}")


if __name__ == "__main__":
    main()
