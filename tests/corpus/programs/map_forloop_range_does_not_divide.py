"""Must be rejected: forloop_range 4 over the 6 columns a block gets."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 12))
    tb = mugraph.new_threadblock_graph((2,), forloop_range=4)
    tb.new_input(a, (1, -1, -1), 1)
    return g
