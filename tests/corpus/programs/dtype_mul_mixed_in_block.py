"""Must be rejected: mul in a block graph of a bfloat16 and a float16 tile."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 4), dtype=mugraph.float16)
    b = g.new_input((4, 4), dtype=mugraph.bfloat16)
    tb = mugraph.new_threadblock_graph((1,))
    ta, tb_ = tb.new_input(a, (-1, -1, -1), -1), tb.new_input(b, (-1, -1, -1), -1)
    tb.mul(ta, tb_)
    return g
