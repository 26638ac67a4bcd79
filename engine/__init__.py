"""pdserve's shared engine core: model, paged KV cache, block manager, scheduler, sampler.

The block manager and the scheduler import no torch: they are plain Python over integers.
"""
