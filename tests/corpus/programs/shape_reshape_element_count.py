"""Must be rejected: reshape of 24 elements to 25."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.reshape(a, (5, 5))
    return g
