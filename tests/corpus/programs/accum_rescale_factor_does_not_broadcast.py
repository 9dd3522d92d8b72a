"""Must be rejected: a rescale factor of [4, 3] for a sum of [4, 4]."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    b = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t, r = tb.new_input(a, (-1, -1, -1), 1), tb.new_input(b, (-1, -1, -1), 1)
    tb.forloop_accum_rescale(t, r)
    return g
