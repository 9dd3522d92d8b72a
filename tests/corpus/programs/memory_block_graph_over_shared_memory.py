"""Must be rejected: a float16 tile of 227 x 512 fills the H100's shared memory; an exp of it
doubles that."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((227, 512))
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, (-1, -1, -1), -1)
    tb.exp(t)
    return g
