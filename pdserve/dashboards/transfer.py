"""The KV transfer dashboard: bandwidth, blocks, latency, failures."""

from __future__ import annotations

from pdserve.dashboards.panels import SEL, Panel, quantiles, rate

TITLE = "pdserve / KV transfer"

PANELS = (
    Panel(
        "KV transfer bandwidth",
        "Bps",
        (rate("pdserve_kv_transfer_bytes_total", SEL, "side, transport"),),
        "Bytes per second sent (prefill) and received (decode).",
    ),
    Panel(
        "Blocks per second",
        "short",
        (
            rate("pdserve_kv_transfer_blocks_total", SEL, "side", "sent/received {{side}}"),
            rate("pdserve_kv_transfer_skipped_blocks_total", SEL, "side", "skipped {{side}}"),
        ),
        "Skipped: blocks decode already held from its prefix cache.",
    ),
    Panel(
        "Transfer latency per request",
        "s",
        quantiles("pdserve_kv_transfer_seconds", SEL, "side"),
        "send: open -> last block acknowledged; receive: reservation -> complete.",
    ),
    Panel(
        "KV transfer stage of TTFT",
        "s",
        quantiles("pdserve_request_ttft_stage_seconds", SEL + ', stage="kv_transfer"'),
        "The part of the transfer that is not overlapped with prefill compute.",
    ),
    Panel(
        "Transfers completed per second",
        "short",
        (rate("pdserve_kv_transfers_total", SEL, "side, transport"),),
    ),
    Panel(
        "Transfer failures per second",
        "short",
        (rate("pdserve_kv_transfer_failures_total", SEL, "side, reason"),),
        "receive: why a reservation was released (aborted = client went away); "
        "send: the error or refusal.",
    ),
    Panel(
        "Refused writes per second",
        "short",
        (rate("pdserve_kv_transfer_refused_writes_total", SEL, "status"),),
    ),
)
