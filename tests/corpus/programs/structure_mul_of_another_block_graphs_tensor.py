"""Must be rejected: mul of another block graph's tile."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    tb1 = mugraph.new_threadblock_graph((1,))
    tb2 = mugraph.new_threadblock_graph((1,))
    t1 = tb1.new_input(a, (-1, -1, -1), -1)
    t2 = tb2.new_input(a, (-1, -1, -1), -1)
    tb1.mul(t1, t2)
    return g
