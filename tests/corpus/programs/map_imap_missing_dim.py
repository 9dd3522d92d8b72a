"""Must be rejected: imap maps grid axis x to dim 2 of a 2-d tensor."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    tb = mugraph.new_threadblock_graph((2,))
    tb.new_input(a, (2, -1, -1), -1)
    return g
