"""Must be rejected: reduction_dimx 3 over a last dim of 4."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2, reduction_dimx=3)
    t = tb.new_input(a, (-1, -1, -1), 1)
    tb.forloop_accum(t, 'sum_todimx')
    return g
