"""Must be rejected: tb.exp(a): the wrong kind of tensor."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,))
    tb.exp(a)
    return g
