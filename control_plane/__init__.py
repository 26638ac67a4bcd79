"""The cluster's control plane: who the workers are, how loaded they are, which KV blocks they
cache, and which requests routers have just sent them.

Two sides, plain data between them:

    worker side (prefill / decode processes)          router side (one or many routers)
    ────────────────────────────────────────          ─────────────────────────────────
    WorkerAgent: register under a lease + epoch,      ClusterView: members, load (with its
    heartbeat, load reports, KV events, drain          own dispatch correction), KV index
              │                                                ▲
              └────────────── Redis (redis_store) ─────────────┘  (or, with no Redis, the
                                                                  router polls the workers
                                                                  it was given: static_source)

Nothing here imports torch, the engine's model code or gRPC stubs of the workers: the block
hashes are ``engine.block_hash``'s (plain Python).
"""
