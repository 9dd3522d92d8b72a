"""Must be rejected: an input of dtype 'int8'."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    g.new_input((4, 6), dtype='int8')
    return g
