"""Must be rejected: two grid axes mapped to dim 0 of an input."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((2, 3))
    tb.new_input(a, (0, 0, -1), -1)
    return g
