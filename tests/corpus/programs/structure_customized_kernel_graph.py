"""Must be rejected: customized() given a kernel graph."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    g.customized([a], g)
    return g
