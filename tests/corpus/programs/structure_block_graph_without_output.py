"""Must be rejected: a block graph that never calls new_output."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,))
    tb.exp(tb.new_input(a, (-1, -1, -1), -1))
    g.customized([a], tb)
    return g
