"""Must be rejected: an input of dtype np.float64."""

import numpy as np

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 6), dtype=np.float64)
    return g
