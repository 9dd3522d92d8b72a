"""Must be rejected: mark_output of a tensor of another kernel graph."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    h = mugraph.new_kernel_graph()
    b = h.new_input((4, 8))
    g.mark_output(b)
    return g
