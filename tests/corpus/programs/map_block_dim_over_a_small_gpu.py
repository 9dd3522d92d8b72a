"""Must be rejected: 512 threads on a GPU spec that allows 256."""

import mugraph


def program():
    small = mugraph.GPUSpec(name='small', shared_memory_per_block=1 << 16, device_memory=1 << 30,
                            multiprocessors=1, max_threads_per_block=256)
    return mugraph.new_threadblock_graph((1,), (512, 1, 1), gpu=small)
