"""Must be rejected: batch dims 2 and 3 do not broadcast."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((2, 4, 8))
    b = g.new_input((3, 8, 5))
    g.matmul(a, b)
    return g
