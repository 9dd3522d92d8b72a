"""Must be rejected: an accumulator written with forloop_dim=1."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    total = tb.forloop_accum(tb.new_input(a, (-1, -1, -1), 1))
    tb.new_output(total, (-1, -1, -1), 1)
    return g
