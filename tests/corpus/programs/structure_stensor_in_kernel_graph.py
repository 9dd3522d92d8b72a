"""Must be rejected: g.exp(t): the wrong kind of tensor."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, (-1, -1, -1), -1)
    g.exp(t)
    return g
