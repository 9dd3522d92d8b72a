"""Must be rejected: a [4, 8] @ [8, 2] float32 graph called with nested list."""

import torch

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8), dtype=mugraph.float32)
    b = g.new_input((8, 2), dtype=mugraph.float32)
    g.mark_output(g.matmul(a, b))
    return g


def inputs():
    return [[[0.0] * 8] * 4, torch.zeros(8, 2)]
