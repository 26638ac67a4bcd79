"""``pdserve bench``: a reproducible serving-benchmark client.

Drives any OpenAI-compatible server (``/v1/completions`` or ``/v1/chat/completions`` with SSE
streaming) or pdserve's gRPC ``GenerationService`` with a seeded synthetic or JSONL workload,
under a closed loop (fixed concurrency) or an open loop (Poisson arrivals), optionally sweeping
the load until an SLO breaks. One direction of dependency:

    distributions ← workload ← (arrivals, records) ← metrics ← clients ← load ← runner ← cli
                                                     config, report, plots: plain data in, files out
"""
