"""Must be rejected: reduction_max over dim 3 in a block graph."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, (-1, -1, -1), -1)
    tb.reduction_max(t, 3)
    return g
