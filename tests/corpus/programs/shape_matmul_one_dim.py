"""Must be rejected: matmul of a vector."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((8,))
    b = g.new_input((8, 5))
    g.matmul(a, b)
    return g
