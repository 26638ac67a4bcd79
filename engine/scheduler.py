"""Iteration-level (continuous) batching with chunked prefill, prefix caching and preemption.

Each ``schedule()`` call builds one step under a token budget, in this order:

1. **running** requests, oldest first, each asking for all its uncomputed tokens (1 for a
   decode, a chunk for a prefill in progress). When blocks run out, the preemption policy picks
   a victim (possibly the request itself) and swaps or recomputes it, until the request fits.
2. **swapped** requests come back (only in a step with no preemption), before any new admission.
3. **waiting** requests are admitted in queue order while the budget, ``max_num_seqs`` and free
   blocks allow; a prompt's cached prefix is skipped, and the rest is chunked to the budget.
   With ``batching="static"`` (the baseline continuous batching is measured against) they are
   admitted only while a batch is being formed, after the previous one fully drained.

``update_from_output`` then advances ``num_computed_tokens``, appends sampled tokens, publishes
newly full blocks to the prefix cache, applies stop conditions and frees finished requests.
No torch here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.preemption import make_preemption_policy
from engine.request import Request, RequestStatus
from engine.request_queue import make_queue
from engine.scheduler_config import SchedulerConfig
from engine.scheduler_output import ScheduledRequest, SchedulerOutput


@dataclass
class SchedulerStats:
    num_preemptions_swap: int = 0
    num_preemptions_recompute: int = 0
    num_blocks_swapped_out: int = 0
    num_blocks_swapped_in: int = 0
    num_prefix_query_blocks: int = 0
    num_prefix_hit_blocks: int = 0

    @property
    def num_preemptions(self) -> int:
        return self.num_preemptions_swap + self.num_preemptions_recompute


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.waiting = make_queue(config.policy)
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.ready: deque[Request] = deque()  # prefilled elsewhere, KV already in our blocks
        self.held: dict[str, Request] = {}  # finished, blocks kept until release_held()
        self.requests: dict[str, Request] = {}
        self.stats = SchedulerStats()
        self._preemption = make_preemption_policy(
            config.preemption_mode, config.policy, config.swap_threshold_tokens
        )
        self._finished_ids: list[str] = []
        self._batch_open = True  # static batching: the current batch still takes new requests

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        """Queue a validated request. Its id must be new."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        request.status = RequestStatus.WAITING
        self.waiting.push(request)

    def finish_request(
        self, request_id: str, status: RequestStatus, stop_reason: int | str | None = None
    ) -> Request | None:
        """Finish (e.g. abort) a request wherever it is and free its blocks. Idempotent:
        returns ``None`` for an unknown or already finished request."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.WAITING:
            if not self.waiting.remove(request):
                self.ready.remove(request)
        elif request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.SWAPPED:
            self.swapped.remove(request)
        request.status = status
        if stop_reason is not None:
            request.stop_reason = stop_reason
        if request.hold_blocks_on_finish and status != RequestStatus.FINISHED_ABORTED:
            self.held[request_id] = request
        else:
            self.block_manager.free(request_id)
        self._finished_ids.append(request_id)
        return request

    def release_held(self, request_id: str) -> bool:
        """Free the blocks a finished ``hold_blocks_on_finish`` request kept. Idempotent."""
        if self.held.pop(request_id, None) is None:
            return False
        self.block_manager.free(request_id)
        return True

    def add_prefilled(self, request: Request) -> None:
        """Queue a request whose prompt KV is already in its blocks (filled by a remote
        prefill) and whose first output token is appended; it joins the running batch in the
        next step that has room, ahead of new admissions."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        if not self.block_manager.has_blocks(request.request_id):
            raise ValueError(f"request {request.request_id!r} holds no blocks")
        self.requests[request.request_id] = request
        request.status = RequestStatus.WAITING
        self.ready.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -------------------------------------------------------------------- step
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []
        preempted: list[str] = []

        # 1. Running requests, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._num_tokens_to_schedule(request, budget)
            if num_new == 0:
                i += 1
                continue
            while True:
                need = request.num_computed_tokens + num_new
                if self.block_manager.allocate(request.request_id, need) is not None:
                    break
                victim = self._preemption.choose_victim(
                    [r for r in self.running if not r.hold_blocks_on_finish] or self.running
                )
                j = self.running.index(victim)
                budget += scheduled.pop(victim.request_id, 0)
                self._preempt(victim, swap_out)
                preempted.append(victim.request_id)
                if victim is request:
                    break
                if j < i:
                    i -= 1
            if request.status != RequestStatus.RUNNING:
                continue  # preempted itself; running[i] is now the next request
            scheduled[request.request_id] = num_new
            budget -= num_new
            i += 1

        # 2. Swapped requests return before anything new is admitted.
        if not preempted:
            while self.swapped and len(self.running) < self.config.max_num_seqs:
                request = self.swapped[0]
                # Room for its blocks *and* this step's new tokens, or it would be swapped in
                # only to be preempted again at once.
                num_new = self._num_tokens_to_schedule(request, budget)
                need = self.block_manager.num_blocks_for(request.num_computed_tokens + num_new)
                extra = max(0, need - len(self.block_manager.host_block_table(request.request_id)))
                if not self.block_manager.can_swap_in(request.request_id, extra):
                    break
                pairs = self.block_manager.swap_in(request.request_id)
                if pairs is None:
                    break
                self.swapped.pop(0)
                swap_in.extend(pairs)
                self.stats.num_blocks_swapped_in += len(pairs)
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                num_new = self._num_tokens_to_schedule(request, budget)
                if (
                    num_new
                    and self.block_manager.allocate(
                        request.request_id, request.num_computed_tokens + num_new
                    )
                    is not None
                ):
                    scheduled[request.request_id] = num_new
                    budget -= num_new

        # 2b. Requests prefilled elsewhere join next, also before new admissions.
        if not preempted:
            while self.ready and len(self.running) < self.config.max_num_seqs:
                request = self.ready.popleft()
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                num_new = self._num_tokens_to_schedule(request, budget)
                if (
                    num_new
                    and self.block_manager.allocate(
                        request.request_id, request.num_computed_tokens + num_new
                    )
                    is not None
                ):
                    scheduled[request.request_id] = num_new
                    budget -= num_new

        # 3. New (or recompute-preempted) requests. Static batching admits only while a batch
        # is being formed: from the step the previous batch drained until the batch is full
        # (max_num_seqs), the queue is empty or blocks run out; a budget-bound step keeps it open.
        static = self.config.batching == "static"
        if static and not (self.running or self.swapped or self.ready):
            self._batch_open = True
        if not preempted and not self.swapped and self._batch_open:
            blocked = False
            while len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
                request = self.waiting.peek()
                admitted = self._admit(request, budget)
                if admitted is None:
                    blocked = True
                    break
                num_new = admitted
                self.waiting.pop()
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                scheduled[request.request_id] = num_new
                budget -= num_new
            if static and (
                not len(self.waiting)
                or len(self.running) >= self.config.max_num_seqs
                or (blocked and budget > 0 and self.config.enable_chunked_prefill)
            ):
                self._batch_open = False

        finished_ids = tuple(self._finished_ids)
        self._finished_ids.clear()
        return SchedulerOutput(
            scheduled=tuple(self._describe(rid, n) for rid, n in scheduled.items()),
            num_scheduled_tokens=self.config.max_num_batched_tokens - budget,
            blocks_to_swap_out=tuple(swap_out),
            blocks_to_swap_in=tuple(swap_in),
            preempted_request_ids=tuple(preempted),
            finished_request_ids=finished_ids,
        )

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: Mapping[str, int]
    ) -> list[Request]:
        """Apply a finished step. ``sampled_token_ids`` holds one new token per request that
        sampled. Returns the requests that received a token (finished ones included)."""
        updated: list[Request] = []
        for item in output.scheduled:
            request = self.requests.get(item.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            request.num_computed_tokens += item.num_scheduled_tokens
            token = sampled_token_ids.get(item.request_id) if item.sample else None
            if token is not None:
                request.append_output_token(token)
            request.update_block_hashes(self.block_size)
            self.block_manager.cache_blocks(
                request.request_id, request.block_hashes, request.num_computed_tokens
            )
            if token is None:
                continue
            updated.append(request)
            status = self.check_stop(request, token)
            if status is not None:
                self.finish_request(request.request_id, status, request.stop_reason)
        return updated

    # ---------------------------------------------------------------- private
    def _num_tokens_to_schedule(self, request: Request, budget: int) -> int:
        num_new = request.num_tokens - request.num_computed_tokens
        if self.config.long_prefill_token_threshold > 0:
            num_new = min(num_new, self.config.long_prefill_token_threshold)
        return min(num_new, budget)

    def _admit(self, request: Request, budget: int) -> int | None:
        """Allocate a waiting request's blocks; return its scheduled tokens or ``None``."""
        hashes = request.update_block_hashes(self.block_size)
        # Keep at least one token to compute: its logits give the next token.
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        query = hashes[:max_hit_blocks]
        cached = self.block_manager.find_cached_prefix(query)
        num_computed = len(cached) * self.block_size
        num_new = request.num_tokens - num_computed
        if self.config.long_prefill_token_threshold > 0:
            num_new = min(num_new, self.config.long_prefill_token_threshold)
        if num_new > budget:
            if not self.config.enable_chunked_prefill:
                return None
            num_new = budget
        need = num_computed + num_new
        if request.hold_blocks_on_finish:
            # KV export (prefill role): take the whole prompt's blocks at admission, so the
            # request never needs a block later and is never preempted while its blocks are
            # being read by a transfer.
            need = max(need, request.num_prompt_tokens)
        if self.block_manager.allocate(request.request_id, need, cached) is None:
            return None
        self.stats.num_prefix_query_blocks += len(query)
        self.stats.num_prefix_hit_blocks += len(cached)
        if request.num_preemptions == 0:
            request.num_cached_tokens = num_computed
        request.num_computed_tokens = num_computed
        return num_new

    def _preempt(self, victim: Request, swap_out: list[tuple[int, int]]) -> None:
        self.running.remove(victim)
        victim.num_preemptions += 1
        can_swap = self.block_manager.can_swap_out(victim.request_id)
        if self._preemption.choose_mode(victim, can_swap) == "swap":
            pairs = self.block_manager.swap_out(victim.request_id)
            swap_out.extend(pairs)
            self.stats.num_preemptions_swap += 1
            self.stats.num_blocks_swapped_out += len(pairs)
            victim.status = RequestStatus.SWAPPED
            self.swapped.append(victim)
        else:
            self.block_manager.free(victim.request_id)
            self.stats.num_preemptions_recompute += 1
            victim.num_computed_tokens = 0
            victim.status = RequestStatus.WAITING
            self.waiting.push_front(victim)

    def check_stop(self, request: Request, token: int) -> RequestStatus | None:
        """The finish status ``token`` (just appended) gives the request, if any."""
        params = request.sampling_params
        num_out = request.num_output_tokens
        if num_out >= params.min_tokens:
            if not params.ignore_eos and token == request.eos_token_id:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and num_out >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.max_total_tokens and request.num_tokens >= request.max_total_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _describe(self, request_id: str, num_new: int) -> ScheduledRequest:
        request = self.requests[request_id]
        params = request.sampling_params
        start = request.num_computed_tokens
        end = start + num_new
        return ScheduledRequest(
            request_id=request_id,
            token_ids=tuple(request.token_ids[start:end]),
            num_computed_tokens=start,
            block_table=tuple(self.block_manager.block_table(request_id)),
            sample=end == request.num_tokens,
            sampling_params=params,
            num_output_tokens=request.num_output_tokens,
            output_token_ids=(
                tuple(request.output_token_ids) if params.needs_output_history else ()
            ),
            prompt_token_ids=(
                tuple(request.prompt_token_ids) if params.needs_prompt_history else ()
            ),
        )
