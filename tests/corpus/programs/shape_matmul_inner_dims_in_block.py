"""Must be rejected: the same mismatch inside a block graph."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    b = g.new_input((6, 3))
    tb = mugraph.new_threadblock_graph((1,))
    ta, tb_ = tb.new_input(a, (-1, -1, -1), -1), tb.new_input(b, (-1, -1, -1), -1)
    tb.matmul(ta, tb_)
    return g
