"""Must be rejected: an input of dtype 'float64'."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 6), dtype='float64')
    return g
