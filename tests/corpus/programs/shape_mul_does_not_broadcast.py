"""Must be rejected: mul of [4, 6] and [4, 5]."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    b = g.new_input((4, 5))
    g.mul(a, b)
    return g
