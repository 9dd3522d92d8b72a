"""Must be rejected: an input of dtype torch.int32."""

import torch

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 6), dtype=torch.int32)
    return g
