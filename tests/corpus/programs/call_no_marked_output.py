"""Must be rejected: a graph without a marked output, called."""

import torch

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    g.exp(a)
    return g


def inputs():
    return [torch.zeros(4, 8, dtype=torch.float16)]
