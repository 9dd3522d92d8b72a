"""Must be rejected: an input of dims (0, 4)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((0, 4))
    return g
