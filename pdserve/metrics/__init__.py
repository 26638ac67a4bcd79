"""Prometheus exporters for every pdserve process (router, prefill, decode, colocated).

The engine and the KV transfer count in plain Python (``engine.metrics``,
``kv_transfer.metrics``); the collectors here read their snapshots at scrape time, so nothing
on a hot path calls into ``prometheus_client``. Metric names and meanings:
``docs/observability.md``.
"""
