"""Must be rejected: add of a tensor of another kernel graph."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    h = mugraph.new_kernel_graph()
    b = h.new_input((4, 8))
    g.add(a, b)
    return g
