"""Must be rejected: forloop_accum_rescale with the accumulator 'mean'."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    b = g.new_input((4, 2))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t, r = tb.new_input(a, (-1, -1, -1), 1), tb.new_input(b, (-1, -1, -1), 1)
    tb.forloop_accum_rescale(t, r, 'mean')
    return g
