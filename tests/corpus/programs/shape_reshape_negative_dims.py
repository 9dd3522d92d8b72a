"""Must be rejected: reshape to (-4, -6)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.reshape(a, (-4, -6))
    return g
