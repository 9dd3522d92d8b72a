"""Must be rejected: add of [4, 6] and [4, 5]."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    b = g.new_input((4, 5))
    g.add(a, b)
    return g
