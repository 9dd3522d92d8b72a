"""Must be rejected: forloop_dim -2 of a 2-d tensor."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 12))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    tb.new_input(a, (-1, -1, -1), -2)
    return g
