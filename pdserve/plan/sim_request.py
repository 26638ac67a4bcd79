"""One simulated request: its shape (from the workload) and what happened to it (times from
the start of the run, seconds)."""

from __future__ import annotations

OK, FAILED = "ok", "failed"


class SimRequest:
    __slots__ = (
        "arrival_s",
        "decode_id",
        "error",
        "finish_s",
        "first_token_s",
        "index",
        "is_burst",
        "num_cached_tokens",
        "num_output",
        "num_preemptions",
        "num_prefix_tokens",
        "num_prompt",
        "prefill_id",
        "prefix_group",
        "status",
        "token_times",
    )

    def __init__(
        self,
        index: int,
        arrival_s: float,
        num_prompt: int,
        num_output: int,
        prefix_group: int = -1,
        num_prefix_tokens: int = 0,
        is_burst: bool = False,
    ) -> None:
        self.index = index
        self.arrival_s = arrival_s  # the client sends it
        self.num_prompt = num_prompt
        self.num_output = num_output  # exactly this many tokens (EOS ignored, as bench sends)
        self.prefix_group = prefix_group  # requests of one group share their first tokens
        self.num_prefix_tokens = num_prefix_tokens
        self.is_burst = is_burst
        self.first_token_s = -1.0  # the client sees the first token
        self.finish_s = -1.0  # the client sees the last
        self.status = FAILED
        self.error = ""
        self.num_cached_tokens = 0  # prompt tokens a prefix cache served
        self.num_preemptions = 0
        self.decode_id = ""  # the worker that streamed it ("" before routing)
        self.prefill_id = ""  # the worker that prefilled it ("" = its decode worker)
        self.token_times: list[float] | None = None  # each token's time (full records only)

    def fail(self, now: float, error: str) -> None:
        self.status = FAILED
        self.error = error
        self.finish_s = now

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.index}, t={self.arrival_s:.3f}, prompt={self.num_prompt}, "
            f"out={self.num_output}, {self.status})"
        )
