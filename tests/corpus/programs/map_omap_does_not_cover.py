"""Must be rejected: the output map leaves grid axis y (3 blocks) unmapped."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((2, 3))
    t = tb.new_input(a, (0, 1, -1), -1)
    tb.new_output(t, (0, -1, -1))
    return g
