"""Must be rejected: an input of dims (4, 2.0)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 2.0))
    return g
