"""Must be rejected: clamp with a scalar that is not a finite number."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.clamp(a, float('-inf'), 1.0)
    return g
