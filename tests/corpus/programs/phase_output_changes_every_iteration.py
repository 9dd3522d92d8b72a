"""Must be rejected: an in-loop value written without a forloop_dim."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t = tb.exp(tb.new_input(a, (-1, -1, -1), 1))
    tb.new_output(t, (-1, -1, -1), -1)
    return g
