"""Must be rejected: add of a matrix and a vector (no implicit rank broadcast)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    b = g.new_input((6,))
    g.add(a, b)
    return g
