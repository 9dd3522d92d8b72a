"""Must be rejected: mul_scalar with a scalar that is not a finite number."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.mul_scalar(a, True)
    return g
