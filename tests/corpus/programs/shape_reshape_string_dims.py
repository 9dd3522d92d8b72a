"""Must be rejected: reshape to '24'."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.reshape(a, '24')
    return g
