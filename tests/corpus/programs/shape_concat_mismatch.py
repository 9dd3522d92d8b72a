"""Must be rejected: concat along dim 1 of tensors that differ in dim 0."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    b = g.new_input((5, 7))
    g.concat(a, b, 1)
    return g
