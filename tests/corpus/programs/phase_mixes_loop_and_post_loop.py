"""Must be rejected: sub of an in-loop tile and the loop's accumulated sum."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t = tb.new_input(a, (-1, -1, -1), 1)
    total = tb.forloop_accum(t, 'sum')
    tb.sub(t, total)
    return g
