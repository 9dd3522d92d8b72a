"""Must be rejected: concat in a block graph of a tile and its reduction."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    b = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((1,))
    ta = tb.new_input(a, (-1, -1, -1), -1)
    tr = tb.reduction(tb.new_input(b, (-1, -1, -1), -1), 0)
    tb.concat(ta, tr, 1)
    return g
