"""Must be rejected: permute of [4, 6] with perm (0, 0) (not an order of its 2 dims)."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 6))
    g.permute(a, (0, 0))
    return g
