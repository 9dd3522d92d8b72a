"""Must be rejected: forloop_accum with the accumulator 3."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t = tb.new_input(a, (-1, -1, -1), 1)
    tb.forloop_accum(t, 3)
    return g
