"""The engine loop the offline API and the services drive: add_request / abort_request / step.

Not thread-safe: one thread owns an engine (the services run it in a dedicated loop thread).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.attention.selector import get_attention_backend
from engine.block_manager import BlockManager
from engine.demo_model import demo_model_path
from engine.detokenizer import IncrementalDetokenizer
from engine.engine_config import EngineConfig
from engine.engine_stats import EngineStats
from engine.kv_cache import KVCache
from engine.kv_cache_spec import KVCacheSpec
from engine.kv_connector.base import KVConnector, NullConnector
from engine.kv_connector.params import KVTransferParams
from engine.metrics import EngineMetrics
from engine.model_card import resolve_max_model_len
from engine.model_config import load_model_config
from engine.model_loader import load_model
from engine.model_runner import ModelRunner
from engine.outputs import RequestOutput, SampledToken
from engine.prompt_validation import resolve_prompt_ids
from engine.request import Request, RequestStatus
from engine.request_snapshot import RequestSnapshot
from engine.resume import ResumeState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_config import SchedulerConfig, prefill_tokens_with_decodes
from engine.scheduler_output import SchedulerOutput
from engine.tracked_request import TrackedRequest

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class LLMEngine:
    def __init__(self, config: EngineConfig, kv_connector: KVConnector | None = None) -> None:
        """``kv_connector``: how KV enters or leaves this engine (a prefill or decode worker's
        connector); None for an engine that keeps its KV to itself."""
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        model_path = config.model or str(demo_model_path())
        self.model_config = load_model_config(model_path, config.dtype)
        mc = self.model_config
        self.max_model_len = resolve_max_model_len(config.max_model_len, mc.max_position_embeddings)
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
        self.kv_cache = KVCache(
            self.kv_spec, num_blocks, num_host, self.device, prefault=config.kv_cache_prefault
        )
        self.block_manager = BlockManager(
            num_blocks, config.block_size, num_host, config.enable_prefix_caching
        )
        self.scheduler_config = SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            max_prefill_tokens_with_decodes=prefill_tokens_with_decodes(
                config.max_prefill_tokens_with_decodes, self.device.type
            ),
            policy=config.scheduling_policy,
            preemption_mode=config.preemption_mode,
            swap_threshold_tokens=config.swap_threshold_tokens,
            batching=config.batching,
        )
        self.kv_connector: KVConnector = kv_connector or NullConnector()
        self.kv_connector.set_wakeup(self._wake)
        self._wakeup: Callable[[], None] | None = None
        self.scheduler = Scheduler(self.scheduler_config, self.block_manager, self.kv_connector)
        self.backend = get_attention_backend(self.device, config.attention_backend)
        self.runner = ModelRunner(mc, self.model, self.kv_cache, self.backend, self.device)
        self._tracked: dict[str, TrackedRequest] = {}
        self._num_invariant_checks = 0
        self._num_invariant_failures = 0
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
        kv_transfer: KVTransferParams | None = None,
        resume: ResumeState | None = None,
    ) -> Request:
        """Validate and queue a request. Raises ValueError naming the problem; the engine's
        state is unchanged on error. ``kv_transfer``: the prompt's KV is exported through, or
        imported from, the engine's KV connector. ``resume``: the prompt ids end with an
        earlier run's outputs (a migrated request, engine.resume)."""
        request, tracked = self._build_request(
            request_id, prompt, sampling_params, prompt_token_ids, priority, arrival_time, resume
        )
        request.kv_transfer = kv_transfer
        self.scheduler.add_request(request)
        self._tracked[request_id] = tracked
        return request

    def _build_request(
        self,
        request_id: str,
        prompt: str | None,
        sampling_params: SamplingParams | None,
        prompt_token_ids: Sequence[int] | None,
        priority: int,
        arrival_time: float | None,
        resume: ResumeState | None = None,
    ) -> tuple[Request, TrackedRequest]:
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        if request_id in self._tracked or request_id in self.scheduler.delayed_free:
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
        if resume is not None:
            resume.validate(len(ids), params.max_tokens)
            request.num_resumed_tokens = resume.num_generated_tokens
        detok = None
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(
                self.tokenizer,
                request.original_prompt_token_ids,
                params.skip_special_tokens,
                params.stop,
                params.include_stop_str_in_output,
            )
            if resume is not None:
                detok.replay(request.generated_token_ids, resume.emitted_text)
        elif params.stop:
            raise ValueError("stop: stop strings need a tokenizer (skip_tokenizer_init is set)")
        tracked = TrackedRequest(
            request, prompt, detok, [] if params.logprobs is not None else None
        )
        return request, tracked

    def abort_request(self, request_id: str) -> bool:
        """Stop a request wherever it is and free its blocks (once the KV connector no longer
        uses them). Idempotent; False if the engine did not know it."""
        tracked = self._tracked.pop(request_id, None)
        finished = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
        return tracked is not None or finished is not None

    def set_wakeup(self, wake: Callable[[], None]) -> None:
        """``wake()`` is called (from any thread) when the KV connector has news for an engine
        that may be idle, e.g. a prompt's KV arrived; the owner of the loop then steps."""
        self._wakeup = wake

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup()

    def snapshot(self, request_id: str) -> RequestSnapshot | None:
        """The request as plain data (None when the engine does not know it)."""
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return None
        return tracked.snapshot()

    def stats(self) -> EngineStats:
        """A snapshot of the pool, the queues and the counters (engine thread)."""
        bm, sched, st = self.block_manager, self.scheduler, self.scheduler.stats
        return EngineStats(
            block_size=bm.block_size,
            num_blocks=bm.num_blocks,
            num_free_blocks=bm.num_free_blocks,
            num_host_blocks=bm.num_host_blocks,
            num_free_host_blocks=bm.num_free_host_blocks,
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            num_waiting_for_remote_kv=len(sched.waiting_for_remote_kv),
            num_swapped=len(sched.swapped),
            num_delayed_free=len(sched.delayed_free),
            num_steps=self.num_steps,
            num_preemptions_swap=st.num_preemptions_swap,
            num_preemptions_recompute=st.num_preemptions_recompute,
            num_blocks_swapped_out=st.num_blocks_swapped_out,
            num_blocks_swapped_in=st.num_blocks_swapped_in,
            num_prefix_query_blocks=st.num_prefix_query_blocks,
            num_prefix_hit_blocks=st.num_prefix_hit_blocks,
            num_invariant_checks=self._num_invariant_checks,
            num_invariant_failures=self._num_invariant_failures,
        )

    def check_invariants(self) -> bool:
        """``check_integrity`` (block accounting, no orphaned owner, every block free when
        idle). Never raises: a failure is logged and counted (``stats()``); returns
        whether the checks passed."""
        self._num_invariant_checks += 1
        try:
            self.check_integrity()
        except AssertionError as e:
            self._num_invariant_failures += 1
            logger.error("engine invariant violated: %s", e)
            return False
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (``BlockManager.reset_prefix_cache``); False while any
        request holds blocks."""
        return self.block_manager.reset_prefix_cache()

    def has_work(self) -> bool:
        """True when ``step()`` would do something now: schedulable requests, or connector
        news (requests that only wait for remote KV need no step)."""
        return self.scheduler.has_schedulable_requests() or self.kv_connector.has_pending_output()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def check_integrity(self) -> None:
        """Raise AssertionError unless the block manager's accounting holds and every request
        holding blocks is one the engine still tracks (in the scheduler, or finished with its
        blocks kept for the KV connector): no block is owned by a forgotten request."""
        self.block_manager.check_integrity()
        known = set(self.scheduler.requests) | set(self.scheduler.delayed_free)
        orphans = self.block_manager.owners() - known
        assert not orphans, f"blocks held by requests the engine forgot: {sorted(orphans)}"
        unfinished = set(self._tracked) - set(self.scheduler.requests)
        assert not unfinished, f"outputs tracked for requests not in the scheduler: {unfinished}"
        if not self.scheduler.requests and not self.scheduler.delayed_free:
            assert self.block_manager.is_idle(), "idle engine still holds blocks"

    @property
    def num_unfinished_requests(self) -> int:
        return self.scheduler.num_unfinished

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one iteration; return an output for every request that produced a token (or
        failed)."""
        started = time.monotonic()
        outputs: list[RequestOutput] = []
        now = started
        connector_output = self.kv_connector.get_finished()
        num_imported = 0
        for request in self.scheduler.update_from_connector(connector_output):
            tracked = self._tracked.get(request.request_id)
            if tracked is None:
                continue
            if request.status == RequestStatus.FINISHED_ERROR:
                del self._tracked[request.request_id]
                outputs.append(tracked.make_error_output(request.error or "KV import failed", now))
                continue
            tracked.first_scheduled_time = tracked.first_scheduled_time or now
            loaded = connector_output.loaded[request.request_id]
            token = SampledToken(loaded.first_token_id, loaded.first_token_logprob)
            outputs.append(self._make_output(tracked, token, now))
            num_imported += 1
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
        saves = self.scheduler.take_kv_saves()
        if saves:
            self.kv_connector.save_kv(
                [
                    dataclasses.replace(s, first_token_logprob=result.sampled[s.request_id].logprob)
                    if s.is_last
                    else s
                    for s in saves
                ]
            )
        now = time.monotonic()
        for request in updated:
            tracked = self._tracked.get(request.request_id)
            if tracked is None:
                continue
            outputs.append(self._make_output(tracked, result.sampled[request.request_id], now))
        # The first token of an imported request was sampled elsewhere: not this engine's.
        self.metrics.record_step(
            now - started,
            sched_out.num_scheduled_tokens,
            len(sched_out.scheduled),
            outputs[num_imported:],
            num_prompt_tokens,
        )
        if self.config.check_invariants:
            self.check_invariants()
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
