"""Must be rejected: the inputs of a matmul kernel in the wrong order."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    b = g.new_input((8, 4))
    tb = mugraph.new_threadblock_graph((1,))
    ta, tb_ = tb.new_input(a, (-1, -1, -1), -1), tb.new_input(b, (-1, -1, -1), -1)
    tb.new_output(tb.matmul(ta, tb_), (-1, -1, -1))
    g.customized([b, a], tb)
    return g
