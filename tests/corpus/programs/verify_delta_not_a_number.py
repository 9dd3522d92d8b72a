"""Must be rejected: verify with delta="a" (it used to fail inside with a TypeError)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    g.mark_output(g.exp(a))
    return g
