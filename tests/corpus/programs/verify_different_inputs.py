"""Must be rejected: a [4, 8] graph verified against a [4, 16] graph."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    g.mark_output(g.exp(a))
    return g


def other():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 16))
    g.mark_output(g.exp(a))
    return g
