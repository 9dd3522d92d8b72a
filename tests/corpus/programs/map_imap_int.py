"""Must be rejected: input_map 0."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((2,))
    tb.new_input(a, 0, -1)
    return g
