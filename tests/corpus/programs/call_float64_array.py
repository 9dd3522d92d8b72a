"""Must be rejected: a [4, 8] @ [8, 2] float32 graph called with float64 array."""

import numpy as np

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8), dtype=mugraph.float32)
    b = g.new_input((8, 2), dtype=mugraph.float32)
    g.mark_output(g.matmul(a, b))
    return g


def inputs():
    return [np.zeros((4, 8), np.float32), np.zeros((8, 2))]
