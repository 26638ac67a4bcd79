"""The engine loop the offline API and the services drive: add_request / abort_request / step.

Not thread-safe: one thread owns an engine (the services run it in a dedicated loop thread).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from engine.attention.selector import get_attention_backend
from engine.block_manager import BlockManager
from engine.demo_model import demo_model_path
from engine.detokenizer import IncrementalDetokenizer
from engine.engine_config import EngineConfig
from engine.kv_cache import KVCache
from engine.kv_cache_spec import KVCacheSpec
from engine.metrics import EngineMetrics
from engine.model_config import load_model_config
from engine.model_loader import load_model
from engine.model_runner import ModelRunner
from engine.outputs import PrefillProgress, RemotePrefillReservation, RequestOutput
from engine.prompt_validation import resolve_prompt_ids
from engine.request import Request, RequestStatus
from engine.sampler import SampledToken
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_config import SchedulerConfig
from engine.scheduler_output import SchedulerOutput
from engine.tracked_request import TrackedRequest

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        model_path = config.model or str(demo_model_path())
        self.model_config = load_model_config(model_path, config.dtype)
        mc = self.model_config
        self.max_model_len = min(
            config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings
        )
        self.tokenizer: Any = None
        if not config.skip_tokenizer_init:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = load_model(mc, self.device)
        self.kv_spec = KVCacheSpec(
            num_layers=mc.num_layers,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            block_size=config.block_size,
            dtype=mc.dtype_str,
            model_id=model_path,
        )
        gb = 1 << 30
        num_blocks = config.num_kv_blocks or KVCache.blocks_for_bytes(
            self.kv_spec, int(config.kv_cache_memory_gb * gb)
        )
        num_host = (
            config.num_host_blocks
            if config.num_host_blocks is not None
            else KVCache.blocks_for_bytes(self.kv_spec, int(config.swap_space_gb * gb))
        )
        if num_blocks < 1:
            raise ValueError("the KV cache must hold at least one block")
        self.kv_cache = KVCache(self.kv_spec, num_blocks, num_host, self.device)
        self.block_manager = BlockManager(
            num_blocks, config.block_size, num_host, config.enable_prefix_caching
        )
        self.scheduler_config = SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            policy=config.scheduling_policy,
            preemption_mode=config.preemption_mode,
            swap_threshold_tokens=config.swap_threshold_tokens,
            batching=config.batching,
        )
        self.scheduler = Scheduler(self.scheduler_config, self.block_manager)
        self.backend = get_attention_backend(self.device, config.attention_backend)
        self.runner = ModelRunner(mc, self.model, self.kv_cache, self.backend, self.device)
        self._tracked: dict[str, TrackedRequest] = {}
        self._remote: dict[str, TrackedRequest] = {}  # decode role: reserved, KV still arriving
        self._exporting: set[str] = set()  # prefill role: requests whose KV is shipped out
        self._progress: list[PrefillProgress] = []
        self._ids = itertools.count()
        self.num_steps = 0
        self.metrics = EngineMetrics()  # read by the services' metrics exporters
        logger.info(
            "engine ready: %s on %s, %d KV blocks (+%d host), backend %s",
            mc.architecture,
            self.device,
            num_blocks,
            num_host,
            self.backend.name,
        )

    # ----------------------------------------------------------------- requests
    @property
    def eos_token_id(self) -> int | None:
        ids = self.model_config.eos_token_ids
        return ids[0] if ids else None

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def tokenize(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("prompt: text prompts need a tokenizer (skip_tokenizer_init is set)")
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def add_request(
        self,
        request_id: str,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        export_kv: bool = False,
    ) -> Request:
        """Validate and queue a request. Raises ValueError naming the problem; the engine's
        state is unchanged on error.

        ``export_kv`` (prefill role): report the request's computed blocks after every step
        (``take_prefill_progress``) and keep its blocks after it finishes until
        ``release_kv(request_id)``, so a transfer can read them.
        """
        request, tracked = self._build_request(
            request_id, prompt, sampling_params, prompt_token_ids, priority, arrival_time
        )
        request.hold_blocks_on_finish = export_kv
        self.scheduler.add_request(request)
        self._tracked[request_id] = tracked
        if export_kv:
            self._exporting.add(request_id)
        return request

    def _build_request(
        self,
        request_id: str,
        prompt: str | None,
        sampling_params: SamplingParams | None,
        prompt_token_ids: Sequence[int] | None,
        priority: int,
        arrival_time: float | None,
    ) -> tuple[Request, TrackedRequest]:
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        if request_id in self._tracked or request_id in self._remote:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if params.structured is not None:
            params.structured.validate()  # a bad grammar is the caller's error, not the step's
        capacity = self.block_manager.num_blocks * self.block_manager.block_size
        ids = resolve_prompt_ids(
            prompt,
            prompt_token_ids,
            self.tokenize,
            self.model_config.vocab_size,
            self.max_model_len,
            capacity,
        )
        request = Request(
            request_id=request_id,
            prompt_token_ids=ids,
            sampling_params=params,
            eos_token_id=self.eos_token_id,
            arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
            priority=priority,
            max_total_tokens=min(self.max_model_len, capacity),
        )
        detok = None
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(
                self.tokenizer,
                ids,
                params.skip_special_tokens,
                params.stop,
                params.include_stop_str_in_output,
            )
        elif params.stop:
            raise ValueError("stop: stop strings need a tokenizer (skip_tokenizer_init is set)")
        tracked = TrackedRequest(
            request, prompt, detok, [] if params.logprobs is not None else None
        )
        return request, tracked

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free its blocks (including blocks held for a KV export or
        reserved for a remote prefill). Idempotent; False if the engine did not know it."""
        known = False
        remote = self._remote.pop(request_id, None)
        if remote is not None:
            self.block_manager.free(request_id)
            known = True
        tracked = self._tracked.pop(request_id, None)
        if tracked is not None:
            self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
            known = True
        self._exporting.discard(request_id)
        if self.scheduler.release_held(request_id):
            known = True
        return known

    # ------------------------------------------------------- disaggregated roles
    def reserve_remote_prefill(
        self,
        request_id: str,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> RemotePrefillReservation | None:
        """Decode role: allocate blocks for a prompt another worker will prefill.

        Blocks whose prefix this engine already caches are reused and reported in
        ``cached_blocks`` (the prefill side skips them). Returns ``None`` (nothing changed)
        when the pool has no room now. Raises ValueError for a bad request. The caller must
        end the reservation with ``admit_remote_prefill`` or ``abort_request``.
        """
        request, tracked = self._build_request(
            request_id, prompt, sampling_params, prompt_token_ids, priority, arrival_time
        )
        hashes = request.update_block_hashes(self.block_manager.block_size)
        hits = self.block_manager.find_cached_prefix(hashes)
        if self.block_manager.allocate(request_id, request.num_prompt_tokens, hits) is None:
            return None
        request.num_cached_tokens = len(hits) * self.block_manager.block_size
        self._remote[request_id] = tracked
        return RemotePrefillReservation(
            request_id=request_id,
            block_ids=tuple(self.block_manager.block_table(request_id)),
            cached_blocks={i: hashes[i] for i in range(len(hits))},
            num_prompt_tokens=request.num_prompt_tokens,
            prompt_token_ids=tuple(request.prompt_token_ids),
        )

    def admit_remote_prefill(
        self, request_id: str, first_token_id: int, first_token_logprob: float | None = None
    ) -> RequestOutput:
        """Decode role: every block of the prompt has arrived; start decoding from the first
        token the prefill worker sampled. Returns that token's output (maybe final)."""
        tracked = self._remote.pop(request_id, None)
        if tracked is None:
            raise KeyError(f"no remote-prefill reservation for {request_id!r}")
        request = tracked.request
        request.num_computed_tokens = request.num_prompt_tokens
        request.append_output_token(first_token_id)
        hashes = request.update_block_hashes(self.block_manager.block_size)
        self.block_manager.cache_blocks(request_id, hashes, request.num_prompt_tokens)
        self._tracked[request_id] = tracked
        tracked.first_scheduled_time = time.monotonic()
        self.scheduler.add_prefilled(request)
        status = self.scheduler.check_stop(request, first_token_id)
        if status is not None:
            self.scheduler.finish_request(request_id, status, request.stop_reason)
        token = SampledToken(first_token_id, first_token_logprob)
        return self._make_output(tracked, token, time.monotonic())

    def take_prefill_progress(self) -> list[PrefillProgress]:
        """Prefill role: for every ``export_kv`` request computed in the last step, how far
        its KV is now complete. Drains the list."""
        progress, self._progress = self._progress, []
        return progress

    def release_kv(self, request_id: str) -> bool:
        """Prefill role: the transfer is over; free the finished request's held blocks."""
        self._exporting.discard(request_id)
        return self.scheduler.release_held(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def num_unfinished_requests(self) -> int:
        return self.scheduler.num_unfinished

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one iteration; return an output for every request that produced a token."""
        started = time.monotonic()
        sched_out = self.scheduler.schedule()
        now = time.monotonic()
        for s in sched_out.scheduled:
            t = self._tracked.get(s.request_id)
            if t is not None and t.first_scheduled_time is None:
                t.first_scheduled_time = now
        num_prompt_tokens = self._num_prompt_tokens(sched_out)
        result = self.runner.execute(sched_out)
        self.num_steps += 1
        sampled = {rid: tok.token_id for rid, tok in result.sampled.items()}
        updated = self.scheduler.update_from_output(sched_out, sampled)
        if self._exporting:
            self._record_progress(sched_out, sampled)
        outputs = []
        now = time.monotonic()
        for request in updated:
            tracked = self._tracked.get(request.request_id)
            if tracked is None:
                continue
            outputs.append(self._make_output(tracked, result.sampled[request.request_id], now))
        self.metrics.record_step(
            now - started,
            sched_out.num_scheduled_tokens,
            len(sched_out.scheduled),
            outputs,
            num_prompt_tokens,
        )
        return outputs

    def _num_prompt_tokens(self, sched_out: SchedulerOutput) -> int:
        """How many of the step's tokens sit at prompt positions (prefill compute)."""
        total = 0
        for s in sched_out.scheduled:
            request = self.scheduler.requests.get(s.request_id)
            if request is not None:
                end = min(s.num_computed_tokens + s.num_scheduled_tokens, request.num_prompt_tokens)
                total += max(0, end - s.num_computed_tokens)
        return total

    def _record_progress(self, sched_out: SchedulerOutput, sampled: dict[str, int]) -> None:
        for item in sched_out.scheduled:
            if item.request_id not in self._exporting:
                continue
            tracked = self._tracked.get(item.request_id)
            request = tracked.request if tracked is not None else None
            if request is None:
                # Finished this step: it is held, find it there.
                request = self.scheduler.held.get(item.request_id)
            if request is None:
                continue
            computed = item.num_computed_tokens + item.num_scheduled_tokens
            self._progress.append(
                PrefillProgress(
                    request_id=item.request_id,
                    num_computed_tokens=computed,
                    block_ids=tuple(self.block_manager.block_table(item.request_id)),
                    block_hashes=tuple(request.block_hashes),
                    is_prompt_done=computed >= request.num_prompt_tokens,
                    first_token_id=sampled.get(item.request_id),
                )
            )

    def _make_output(self, t: TrackedRequest, token: SampledToken, now: float) -> RequestOutput:
        request = t.request
        new_ids = t.new_token_ids()
        finished = request.is_finished
        if t.detok is not None and t.detok.stop_string is not None and not finished:
            self.scheduler.finish_request(
                request.request_id, RequestStatus.FINISHED_STOPPED, t.detok.stop_string
            )
            finished = True
        if finished:
            self._tracked.pop(request.request_id, None)
        return t.make_output(token, new_ids, now, finished)
