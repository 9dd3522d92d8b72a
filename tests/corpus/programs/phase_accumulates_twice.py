"""Must be rejected: forloop_accum of an accumulated value."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    total = tb.forloop_accum(tb.new_input(a, (-1, -1, -1), 1))
    tb.forloop_accum(total)
    return g
