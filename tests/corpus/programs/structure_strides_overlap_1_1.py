"""Must be rejected: an input with strides (1, 1)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 8), strides=(1, 1))
    return g
