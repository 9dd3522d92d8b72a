"""Must be rejected: matmul of [4, 8] by [6, 3]: the inner dims differ."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    b = g.new_input((6, 3))
    g.matmul(a, b)
    return g
