"""Must be rejected: an input with strides (8,)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 8), strides=(8,))
    return g
