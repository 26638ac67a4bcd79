"""Iteration-level (continuous) batching with chunked prefill, prefix caching and preemption.

Each step, in order:

0. ``update_from_connector``: requests whose KV arrived from elsewhere start running from the
   first token that came with it; failed imports end with an error; blocks the KV connector
   held for finished requests are freed.
1. **running** requests, oldest first, each asking for all its uncomputed tokens (1 for a
   decode, a chunk for a prefill in progress). When blocks run out, the preemption policy picks
   a victim (possibly the request itself; never a request whose KV is being exported) and
   swaps or recomputes it, until the request fits.
2. **swapped** requests come back (only in a step with no preemption), before any new admission.
3. **waiting** requests are admitted in queue order while the budget, ``max_num_seqs``, free
   blocks and the batching policy allow; a prompt's cached prefix is skipped, and the rest is
   chunked to the budget. A request whose prompt KV comes through the connector takes its
   blocks and waits in WAITING_FOR_REMOTE_KV (no compute); one whose KV is exported takes its
   whole prompt's blocks at once.

In a step that also decodes, prefill chunks (steps 1-3 together) take at most
``max_prefill_tokens_with_decodes`` tokens (``engine.prefill_budget``).

``update_from_output`` then advances ``num_computed_tokens``, appends sampled tokens, publishes
newly full blocks to the prefix cache, lists exported blocks that became complete, applies stop
conditions and frees finished requests (unless the connector still needs their blocks).
No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.batching import make_batching_policy
from engine.block_hash import BlockHash
from engine.block_manager import BlockManager
from engine.export_progress import next_save
from engine.kv_connector.base import KVConnector, KVConnectorOutput, KVSave, NullConnector
from engine.preemption import make_preemption_policy
from engine.prefill_budget import PrefillBudget, any_decoding, to_compute
from engine.request import Request, RequestStatus
from engine.request_queue import make_queue
from engine.scheduler_config import SchedulerConfig
from engine.scheduler_output import SchedulerOutput
from engine.scheduler_stats import SchedulerStats
from engine.stop_conditions import finish_status


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        connector: KVConnector | None = None,
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.connector: KVConnector = connector or NullConnector()
        self.waiting = make_queue(config.policy)  # WAITING and PREEMPTED
        self.waiting_for_remote_kv: dict[str, Request] = {}
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.delayed_free: dict[str, Request] = {}  # finished; the connector still uses blocks
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.stats = SchedulerStats()
        self._preemption = make_preemption_policy(
            config.preemption_mode, config.policy, config.swap_threshold_tokens
        )
        self._batching = make_batching_policy(config.batching)
        self._finished_ids: list[str] = []
        self._saves: list[KVSave] = []
        capped = config.enable_chunked_prefill and config.batching == "continuous"
        self._prefill = PrefillBudget(
            config.max_num_batched_tokens,
            config.max_prefill_tokens_with_decodes if capped else 0,
        )

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        """Queue a validated request. Its id must be new."""
        if request.request_id in self.requests or request.request_id in self.delayed_free:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        request.status = RequestStatus.WAITING
        self.waiting.push(request)

    def finish_request(
        self, request_id: str, status: RequestStatus, stop_reason: int | str | None = None
    ) -> Request | None:
        """Finish (e.g. abort) a request wherever it is. Its blocks are freed, or kept until
        the connector lists it ``freeable``. Idempotent: ``None`` for an unknown or already
        finished request."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status.is_queued:
            self.waiting.remove(request)
        elif request.status == RequestStatus.WAITING_FOR_REMOTE_KV:
            del self.waiting_for_remote_kv[request_id]
        elif request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.SWAPPED:
            self.swapped.remove(request)
        request.status = status
        if stop_reason is not None:
            request.stop_reason = stop_reason
        table = tuple(self.block_manager.block_table(request_id))
        if self.connector.request_finished(request, table):
            self.delayed_free[request_id] = request
        else:
            self.block_manager.free(request_id)
        self._finished_ids.append(request_id)
        return request

    def update_from_connector(self, output: KVConnectorOutput) -> list[Request]:
        """Apply what the connector finished since the last step. Returns the requests that
        received their first token (from KV loaded elsewhere), finished ones included, and
        the requests the connector failed (status FINISHED_ERROR, ``error`` set)."""
        changed: list[Request] = []
        for request_id in output.freeable:
            if self.delayed_free.pop(request_id, None) is not None:
                self.block_manager.free(request_id)
        for request_id, why in output.failed.items():
            request = self.waiting_for_remote_kv.get(request_id)
            if request is None:
                continue  # aborted meanwhile
            request.error = why
            intact = output.intact.get(request_id, 0)
            if intact:  # the KV that did arrive stays as cached prefix for a retry
                self.block_manager.cache_blocks(
                    request_id, request.update_block_hashes(self.block_size), intact
                )
            self.finish_request(request_id, RequestStatus.FINISHED_ERROR)
            changed.append(request)
        for request_id, loaded in output.loaded.items():
            request = self.waiting_for_remote_kv.pop(request_id, None)
            if request is None:
                continue
            request.num_computed_tokens = request.num_prompt_tokens
            request.append_output_token(loaded.first_token_id)
            self.block_manager.cache_blocks(
                request_id, request.update_block_hashes(self.block_size), request.num_prompt_tokens
            )
            request.status = RequestStatus.RUNNING
            self.running.append(request)  # its batch slot was taken at admission
            changed.append(request)
            status = finish_status(request, loaded.first_token_id)
            if status is not None:
                self.finish_request(request_id, status, request.stop_reason)
        return changed

    def take_kv_saves(self) -> list[KVSave]:
        """Exported blocks that became complete in the last ``update_from_output``."""
        saves, self._saves = self._saves, []
        return saves

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_schedulable_requests(self) -> bool:
        """Work a step can do now (requests waiting for remote KV alone need none)."""
        return bool(self.running or self.swapped or len(self.waiting))

    # -------------------------------------------------------------------- step
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        self._prefill.start_step(any_decoding(self.running))
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
                # An exporting request holds its whole prompt's blocks from admission on, so
                # it never gets here itself; nor is it ever a victim (a transfer reads them).
                victim = self._preemption.choose_victim(
                    [r for r in self.running if not r.is_export] or [request]
                )
                j = self.running.index(victim)
                refund = scheduled.pop(victim.request_id, 0)
                budget += refund
                self._prefill.refund(to_compute(victim), refund)
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
            self._prefill.charge(to_compute(request), num_new)
            i += 1

        # 2. Swapped requests return before anything new is admitted.
        if not preempted:
            while self.swapped and self._num_slots_taken() < self.config.max_num_seqs:
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
                budget -= self._schedule_resumed(request, budget, scheduled)

        # 3. New (or recompute-preempted) requests, when the batching policy admits.
        if (
            not preempted
            and not self.swapped
            and self._batching.is_admission_open(self._num_slots_taken())
        ):
            blocked = False
            while (
                len(self.waiting)
                and budget > 0
                and self._num_slots_taken() < self.config.max_num_seqs
            ):
                request = self.waiting.peek()
                admitted = self._admit(request, budget)
                if admitted is None:
                    blocked = True
                    break
                self.waiting.pop()
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KV:
                    self.waiting_for_remote_kv[request.request_id] = request
                    continue  # holds its blocks; no compute until the KV is loaded
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                scheduled[request.request_id] = admitted
                budget -= admitted
            self._batching.after_admission(
                queue_empty=not len(self.waiting),
                batch_full=self._num_slots_taken() >= self.config.max_num_seqs,
                blocked=blocked and budget > 0 and self.config.enable_chunked_prefill,
            )

        finished_ids = tuple(self._finished_ids)
        self._finished_ids.clear()
        return SchedulerOutput(
            scheduled=tuple(
                self.requests[rid].scheduled(n, self.block_manager.block_table(rid))
                for rid, n in scheduled.items()
            ),
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
            if request.is_export:
                self._record_save(request, token)
            if token is None:
                continue
            updated.append(request)
            status = finish_status(request, token)
            if status is not None:
                self.finish_request(request.request_id, status, request.stop_reason)
        return updated

    # ---------------------------------------------------------------- private
    def _num_slots_taken(self) -> int:
        """Batch slots in use: running requests and those whose KV is on its way."""
        return len(self.running) + len(self.waiting_for_remote_kv)

    def _num_tokens_to_schedule(self, request: Request, budget: int) -> int:
        num_new = remaining = to_compute(request)
        if self.config.long_prefill_token_threshold > 0:
            num_new = min(num_new, self.config.long_prefill_token_threshold)
        return min(self._prefill.limit(remaining, num_new), budget)

    def _schedule_resumed(self, request: Request, budget: int, scheduled: dict[str, int]) -> int:
        """Give a request that just rejoined the running batch this step's tokens if its
        blocks allow; returns the tokens scheduled (0: it runs from the next step)."""
        num_new = self._num_tokens_to_schedule(request, budget)
        need = request.num_computed_tokens + num_new
        if num_new and self.block_manager.allocate(request.request_id, need) is not None:
            scheduled[request.request_id] = num_new
            self._prefill.charge(to_compute(request), num_new)
            return num_new
        return 0

    def _admit(self, request: Request, budget: int) -> int | None:
        """Allocate a waiting request's blocks; return its scheduled tokens (0 when it now
        waits for remote KV) or ``None`` when it cannot be admitted this step."""
        hashes = request.update_block_hashes(self.block_size)
        # Keep at least one token to compute: its logits give the next token.
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        query = hashes[:max_hit_blocks]
        cached = self.block_manager.find_cached_prefix(query)
        num_computed = len(cached) * self.block_size
        num_external, is_async = self.connector.get_num_new_matched_tokens(request, num_computed)
        if num_external:
            # Every token past the local hit arrives from elsewhere, with the first output.
            need = request.num_prompt_tokens
            if self.block_manager.allocate(request.request_id, need, cached) is None:
                return None
            self._count_hits(request, query, cached, num_computed)
            self.connector.update_state_after_alloc(
                request, tuple(self.block_manager.block_table(request.request_id)), num_external
            )
            if is_async:
                request.status = RequestStatus.WAITING_FOR_REMOTE_KV
            return 0
        num_new = remaining = request.num_tokens - num_computed
        if self.config.long_prefill_token_threshold > 0:
            num_new = min(num_new, self.config.long_prefill_token_threshold)
        limit = self._prefill.limit(remaining, budget)
        if num_new > limit:
            if not self.config.enable_chunked_prefill or limit == 0:
                return None
            num_new = limit
        need = num_computed + num_new
        if request.is_export:
            # The rule that keeps exports safe: the whole prompt's blocks at admission, so the
            # request never needs a block later and is never preempted while a transfer
            # reads its blocks.
            need = max(need, request.num_prompt_tokens)
        if self.block_manager.allocate(request.request_id, need, cached) is None:
            return None
        self._count_hits(request, query, cached, num_computed)
        self._prefill.charge(remaining, num_new)
        return num_new

    def _count_hits(
        self, request: Request, query: Sequence[BlockHash], cached: Sequence[int], num_computed: int
    ) -> None:
        self.stats.num_prefix_query_blocks += len(query)
        self.stats.num_prefix_hit_blocks += len(cached)
        if request.num_preemptions == 0:
            request.num_cached_tokens = num_computed
        request.num_computed_tokens = num_computed

    def _record_save(self, request: Request, token: int | None) -> None:
        """List the exported request's prompt blocks that this step completed."""
        table = self.block_manager.block_table(request.request_id)
        save = next_save(request, table, self.block_size, token)
        if save is not None:
            self._saves.append(save)

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
            victim.status = RequestStatus.PREEMPTED
            self.waiting.push_front(victim)
