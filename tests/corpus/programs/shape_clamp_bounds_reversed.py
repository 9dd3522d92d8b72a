"""Must be rejected: clamp with min above max."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.clamp(a, 1, -1)
    return g
