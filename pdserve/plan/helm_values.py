"""The chart values (helm/pdserve/values.yaml's names) that run a planned configuration.

Replicas per role, the engine limits the plan chose as pool flags, and autoscaling bounds and
targets from the simulated run at the planned rate:

    prefill  metric waitingRequests, target = the mean waiting prompts per prefill worker at
             the planned rate (scale out when queues grow past what the SLO held at)
    decode   metric kvUsage, target = the mean KV usage of the decode pool at that rate
    bounds   minReplicas = the plan, maxReplicas = 2x (room for twice the traffic)

A pool of more than one pod needs ``controlPlane.mode: redis`` (worker discovery; PENDING in
the chart, issue 14): the values say so, and the chart's schema refuses them until then.
Autoscalers are written switched off (``hpa.enabled: false``): turn one on to use them.
"""

from __future__ import annotations

from typing import Any

from pdserve.plan.planner import Evaluation


def _mean(values: list[float] | list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def helm_values(e: Evaluation) -> dict[str, Any]:
    c = e.candidate
    p = e.point
    values: dict[str, Any] = {}
    if c.mode == "colocated":
        raise ValueError("the chart runs disaggregated pools; a colocated plan has no values")
    waiting = kv = 0.0
    if p is not None:
        # Samples of the unit's run (pool sums): per worker for the prefill queue.
        waiting = _mean(p.samples.waiting.get("prefill", [])) / max(1, p.pools[0].num_workers)
        kv = _mean(p.samples.kv_usage.get("decode", []))
    values["prefill"] = {
        "replicas": c.num_prefill,
        "flags": {"maxNumBatchedTokens": c.chunk_tokens},
        "autoscaling": {
            "minReplicas": c.num_prefill,
            "maxReplicas": 2 * c.num_prefill,
            "metric": "waitingRequests",
            "target": round(max(waiting, 0.5), 2),
            "hpa": {"enabled": False},
        },
    }
    values["decode"] = {
        "replicas": c.num_decode,
        "flags": {"maxNumSeqs": c.max_num_seqs},
        "autoscaling": {
            "minReplicas": c.num_decode,
            "maxReplicas": 2 * c.num_decode,
            "metric": "kvUsage",
            "target": round(min(max(kv, 0.05), 0.95), 3),
            "hpa": {"enabled": False},
        },
    }
    if c.num_prefill > 1 or c.num_decode > 1:
        values["controlPlane"] = {"mode": "redis"}
    return values


def to_yaml(values: dict[str, Any], header: str) -> str:
    import yaml

    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    return "\n".join(lines) + "\n" + yaml.safe_dump(values, sort_keys=False)
