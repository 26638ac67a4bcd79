"""The SLO overview dashboard: request outcomes, goodput, latency, error ratios."""

from __future__ import annotations

from pdserve.dashboards.panels import DONE, POOL, RI, SEL, Panel, Target, mean, quantiles, rate

TITLE = "pdserve / SLO overview"

PANELS = (
    Panel(
        "Requests per second by outcome",
        "reqps",
        (
            rate("pdserve_request_finished_total", SEL, "reason"),
            rate("pdserve_request_rejected_total", SEL, "reason", "rejected {{reason}}"),
        ),
        "Ended requests by finish reason, and refusals by reason (router).",
    ),
    Panel(
        "Goodput (requests meeting every SLO)",
        "percentunit",
        (
            Target(
                f"sum(rate(pdserve_goodput_requests_total{{{SEL}}}[{RI}]))"
                f" / sum(rate(pdserve_request_finished_total{{{DONE}}}[{RI}]))",
                "goodput ratio",
            ),
        ),
        "Finished requests within --slo-ttft-ms and --slo-itl-ms, over all finished requests.",
        kind="stat",
        width=6,
    ),
    Panel(
        "Goodput tokens per second",
        "short",
        (
            Target(f"sum(rate(pdserve_goodput_tokens_total{{{SEL}}}[{RI}]))", "goodput"),
            Target(f"sum(rate(pdserve_request_generation_tokens_total{{{SEL}}}[{RI}]))", "all"),
        ),
        width=6,
    ),
    Panel(
        "Time to first token",
        "s",
        quantiles("pdserve_request_ttft_seconds", SEL),
        "From arrival at the router to the first token it sends.",
    ),
    Panel(
        "Inter-token latency",
        "s",
        quantiles("pdserve_request_inter_token_latency_seconds", SEL),
        "Time between consecutive token deliveries of a request (router).",
    ),
    Panel(
        "Time per output token (finished requests)",
        "s",
        quantiles("pdserve_request_time_per_output_token_seconds", SEL),
    ),
    Panel("End-to-end latency", "s", quantiles("pdserve_request_e2e_seconds", SEL)),
    Panel(
        "TTFT breakdown (mean per stage)",
        "s",
        (mean("pdserve_request_ttft_stage_seconds", SEL, "stage"),),
        "router_queue (router), prefill_queue and prefill_compute (the engine that "
        "prefilled), kv_transfer (prefill: first token -> last block acknowledged), "
        "decode_admission (decode: KV complete -> first token sent).",
        extra={"stack": True},
    ),
    Panel(
        "Queue time per pool",
        "s",
        quantiles("pdserve_request_ttft_stage_seconds", POOL + ', stage="prefill_queue"', "role"),
        "Engine queue: arrival -> first scheduled, per pool (local prefills only).",
    ),
    Panel(
        "SLO error ratio (5m)",
        "percentunit",
        (
            Target(
                'pdserve:slo_ttft_error_ratio:rate5m{namespace=~"$namespace", model=~"$model"}',
                "ttft",
            ),
            Target(
                'pdserve:slo_itl_error_ratio:rate5m{namespace=~"$namespace", model=~"$model"}',
                "itl",
            ),
        ),
        "Share of requests missing the TTFT / ITL SLO (recording rules; 1% is the budget).",
    ),
    Panel(
        "Error and rejection ratio",
        "percentunit",
        (
            Target(
                f'sum(rate(pdserve_request_finished_total{{{SEL}, reason=~"error|timeout"}}[{RI}]))'
                f" / sum(rate(pdserve_request_finished_total{{{SEL}}}[{RI}]))",
                "errors",
            ),
            Target(
                f"sum(rate(pdserve_request_rejected_total{{{SEL}}}[{RI}]))"
                f" / (sum(rate(pdserve_request_rejected_total{{{SEL}}}[{RI}]))"
                f" + sum(rate(pdserve_request_finished_total{{{SEL}}}[{RI}])))",
                "rejected",
            ),
        ),
    ),
    Panel(
        "Tokens per second",
        "short",
        (
            Target(f"sum(rate(pdserve_request_prompt_tokens_total{{{SEL}}}[{RI}]))", "prompt"),
            Target(
                f"sum(rate(pdserve_request_generation_tokens_total{{{SEL}}}[{RI}]))", "generation"
            ),
        ),
    ),
)
