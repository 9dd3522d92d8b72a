"""Must be rejected: a block graph made from another kernel graph's input."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 8))
    h = mugraph.new_kernel_graph()
    b = h.new_input((4, 8))
    g.customized([b], copy_block(b))
    return g


def copy_block(x):
    tb = mugraph.new_threadblock_graph((1,))
    tb.new_output(tb.new_input(x, (-1, -1, -1), -1), (-1, -1, -1))
    return tb
