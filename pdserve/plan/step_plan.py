"""One exact step of a simulated worker: ``engine.scheduler.Scheduler.schedule`` over the
worker's requests, then what ``update_from_output`` does with the step's result.

    plan_exact(w)    ->  work (seconds at full speed), or None when there is nothing to run
    finish_exact(w)  at the step's end: tokens, first tokens, finishes, prefix publishing

Stage order and rules as in the engine: running oldest first (decode 1 token, prefill a
chunk; when blocks run out, preempt the latest arrival, swapping or recomputing it), swapped
back (only in a step without preemption, only with room for their next tokens), prefilled
elsewhere (REMOTE), then waiting (prefix hits skipped, chunked to the budget; an EXPORT
request takes its whole prompt's blocks at admission). In a step that also decodes, the prefill
chunks together take at most ``max_prefill_tokens_with_decodes`` tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.prefill_budget import PrefillBudget
from pdserve.plan.seq import EXPORT, Seq
from pdserve.plan.step_shape import StepShape

if TYPE_CHECKING:
    from pdserve.plan.engine_model import EngineModel
    from pdserve.plan.worker_settings import WorkerSettings


def admission(
    w: EngineModel, seq: Seq, budget: int, prefill: PrefillBudget
) -> tuple[int, int, int] | None:
    """(prefix-hit blocks, tokens to schedule, private blocks to allocate) for admitting the
    waiting ``seq`` under ``budget`` and what ``prefill`` has left (as the engine's scheduler
    cuts it); None when they rule it out this step."""
    s, bs = w.settings, w.bs
    hit = 0
    if seq.group >= 0 and seq.req.num_prefix_tokens >= bs:
        max_hit = min((seq.num_tokens - 1) // bs, seq.req.num_prefix_tokens // bs)
        hit = min(w.pool.cached_blocks(seq.group), max_hit)
    computed = hit * bs
    q = remaining = seq.num_tokens - computed
    if s.long_prefill_token_threshold:
        q = min(q, s.long_prefill_token_threshold)
    limit = prefill.limit(remaining, budget)
    if q > limit:
        if not s.enable_chunked_prefill or limit <= 0:
            return None
        q = limit
    need = computed + q
    if seq.mode == EXPORT:
        need = max(need, seq.req.num_prompt)
    return hit, q, w.pool.blocks_for(need) - hit


def preempt(w: EngineModel, victim: Seq, num_scheduled: int = 0) -> int:
    """Take ``victim`` out of the batch (swap or recompute); returns blocks swapped out.
    ``num_scheduled``: tokens it already got (and allocated blocks for) in this step."""
    if victim.is_decoding:
        w.stop_decoding(victim)
        victim.num_blocks = w.pool.blocks_for(victim.computed + num_scheduled)
    del w.running[victim]
    w.prefilling.pop(victim, None)
    if victim.stale:
        victim.stale = False
        w.stale.remove(victim)
    victim.req.num_preemptions += 1
    w.num_preemptions += 1
    held = victim.num_blocks
    pool, s = w.pool, w.settings
    can_swap = pool.num_host_blocks - pool.num_host_used >= held
    if s.preemption_mode == "recompute":
        swap = False
    elif s.preemption_mode == "swap":
        swap = can_swap
    else:
        swap = can_swap and victim.computed >= s.swap_threshold_tokens
    if swap:
        pool.swap_out(held - victim.num_prefix_blocks, victim.num_prefix_blocks)
        if victim.group_ref:
            pool.unref_group(victim.group)
            victim.group_ref = False
        victim.host_blocks = held
        victim.num_blocks = victim.num_prefix_blocks = 0
        w.swapped.append(victim)
        w.num_swapped_blocks += held
        return held
    w.free_blocks(victim, held)
    victim.computed = 0
    w.waiting.appendleft(victim)
    return 0


def prefill_budget(s: WorkerSettings, decodes: bool) -> PrefillBudget:
    """The engine's prefill tokens for a step (``engine.prefill_budget``)."""
    cap = s.max_prefill_tokens_with_decodes if s.enable_chunked_prefill else 0
    budget = PrefillBudget(s.max_num_batched_tokens, cap)
    budget.start_step(decodes)
    return budget


def plan_exact(w: EngineModel) -> float | None:
    s, pool = w.settings, w.pool
    budget = s.max_num_batched_tokens
    # A request one token behind decodes (the engine counts a prompt's last token so too).
    prefill = prefill_budget(s, bool(w.ready) or any(_remaining(w, r) <= 1 for r in w.running))
    qs: dict[Seq, int] = {}
    preempted = False
    swapped_blocks = 0
    order = list(w.running)

    # 1. Running requests, oldest first.
    i = 0
    while i < len(order) and budget > 0:
        seq = order[i]
        c = w.computed_of(seq)
        rest = _remaining(w, seq)
        q = rest
        if not seq.is_decoding and s.long_prefill_token_threshold:
            q = min(q, s.long_prefill_token_threshold)
        q = min(prefill.limit(rest, q), budget)
        if q <= 0:
            i += 1
            continue
        need = pool.blocks_for(c + q) - w.blocks_of(seq)
        gone = False
        while need > 0 and not pool.allocate(need):
            candidates = [r for r in order if r.mode != EXPORT] or order
            victim = max(candidates, key=lambda r: r.engine_arrival)
            j = order.index(victim)
            scheduled = qs.pop(victim, 0)
            budget += scheduled
            prefill.refund(_remaining(w, victim), scheduled)
            swapped_blocks += preempt(w, victim, scheduled)
            order.pop(j)
            preempted = True
            if victim is seq:
                gone = True
                break
            if j < i:
                i -= 1
            need = pool.blocks_for(c + q) - w.blocks_of(seq)
        if gone:
            continue
        if need > 0 and not seq.is_decoding:
            seq.num_blocks += need
        qs[seq] = q
        budget -= q
        prefill.charge(rest, q)
        i += 1

    # 2. Swapped requests come back before anything new.
    if not preempted:
        while w.swapped and len(order) < s.max_num_seqs:
            seq = w.swapped[0]
            rest = seq.num_tokens - seq.computed
            q = min(prefill.limit(rest, rest), budget)
            need = pool.blocks_for(seq.computed + q)
            extra = max(0, need - seq.host_blocks)
            if pool.num_free < seq.host_blocks + extra:
                break
            pool.swap_in(seq.host_blocks)
            swapped_blocks += seq.host_blocks
            seq.num_blocks, seq.host_blocks = seq.host_blocks, 0
            w.swapped.pop(0)
            seq.resumed = True
            _join(w, order, seq)
            if q and pool.allocate(max(0, need - seq.num_blocks)):
                seq.num_blocks = max(need, seq.num_blocks)
                qs[seq] = q
                budget -= q
                prefill.charge(rest, q)

    # 2b. Requests prefilled elsewhere.
    if not preempted:
        while w.ready and len(order) < s.max_num_seqs:
            seq = w.ready.popleft()
            _join(w, order, seq)
            rest = seq.num_tokens - seq.computed
            q = min(prefill.limit(rest, rest), budget)
            need = max(0, pool.blocks_for(seq.computed + q) - seq.num_blocks)
            if q and pool.allocate(need):
                seq.num_blocks += need
                qs[seq] = q
                budget -= q
                prefill.charge(rest, q)

    # 3. New (or recompute-preempted) requests.
    if not preempted and not w.swapped:
        while w.waiting and budget > 0 and len(order) < s.max_num_seqs:
            seq = w.waiting[0]
            plan = admission(w, seq, budget, prefill)
            if plan is None:
                break
            hit, q, private = plan
            if seq.group >= 0:
                pool.ref_group(seq.group)  # pin the hit blocks before allocating
                seq.group_ref = True
            if not pool.allocate(private):
                if seq.group_ref:
                    pool.unref_group(seq.group)
                    seq.group_ref = False
                break
            w.waiting.popleft()
            seq.computed = hit * w.bs
            seq.num_blocks = hit + private
            seq.num_prefix_blocks = hit
            if seq.req.num_preemptions == 0:
                seq.req.num_cached_tokens = hit * w.bs
            _join(w, order, seq)
            qs[seq] = q
            budget -= q
            prefill.charge(seq.num_tokens - seq.computed, q)

    w.skipped = []
    if budget <= 0:  # decoding requests the budget did not reach keep their token for later
        w.skipped = [r for r in order if r.is_decoding and r not in qs]
    w.chunks = list(qs.items())
    if not qs and not swapped_blocks:
        return None
    return w.cost.seconds(_shape(w, w.chunks)) + w.swap.seconds(swapped_blocks)


def _remaining(w: EngineModel, seq: Seq) -> int:
    """Tokens ``seq`` has left to compute (1: it decodes)."""
    return 1 if seq.is_decoding else seq.num_tokens - w.computed_of(seq)


def _join(w: EngineModel, order: list[Seq], seq: Seq) -> None:
    order.append(seq)
    w.running[seq] = None
    w.prefilling[seq] = None


def _shape(w: EngineModel, chunks: list[tuple[Seq, int]]) -> StepShape:
    tokens = sampled = ctx = prefill = 0
    pairs = 0.0
    for seq, q in chunks:
        c = w.computed_of(seq)
        tokens += q
        ctx += c + q
        if seq.is_decoding or c + q >= seq.num_tokens:
            sampled += 1
        if q > 1:
            pairs += q * (c + (q + 1) / 2)
            prefill += q
    return StepShape(tokens, len(chunks), sampled, ctx, pairs, prefill)


def finish_exact(w: EngineModel) -> None:
    t, t0 = w.loop.now, w.t_start
    dur = t - t0
    if not w.chunks:  # a swap-only step
        return
    # Decoding requests the budget skipped: their computed must not move with the steps.
    for seq in w.skipped:
        w.shift_decoding(seq, -1)
        if not seq.stale:
            seq.stale = True
            seq.last_token_s = t0
            w.stale.append(seq)
    w.steps += 1
    w.num_steps_run += 1
    num_decoding = 0
    for seq, q in w.chunks:
        w.num_tokens_computed += q
        if seq.is_decoding:
            num_decoding += 1
            if w.record_tokens:
                seq.req.token_times.append(t)  # type: ignore[union-attr]
            if seq.stale:
                w.sink.gap(t - seq.last_token_s)
                seq.stale = False
                w.stale.remove(seq)
                num_decoding -= 1
            continue
        seq.computed += q
        if seq.computed < seq.num_tokens:
            _progress(w, seq)
            continue
        if seq.mode == EXPORT:  # prompt done: the first token goes with the KV
            publish_prefix(w, seq)
            del w.running[seq]
            w.prefilling.pop(seq, None)
            w.held.add(seq)
            w.hooks.prompt_done(w, seq)
            continue
        publish_prefix(w, seq)
        first = seq.num_out == 0
        seq.num_out += 1
        seq.num_tokens += 1
        if first:
            w.hooks.first_token(w, seq)  # it records the first token's time
        else:
            w.sink.gap(t - seq.last_token_s)
            if w.record_tokens:
                seq.req.token_times.append(t)  # type: ignore[union-attr]
        seq.last_token_s = t
        seq.resumed = False
        if seq.num_out >= seq.req.num_output:
            del w.running[seq]
            w.prefilling.pop(seq, None)
            w.free_blocks(seq, seq.num_blocks)
            w.hooks.finished(w, seq)
        else:
            w.start_decoding(seq)
    if num_decoding:
        w.sink.gaps(dur, dur, 1, num_decoding)
    w.pop_finished()


def _progress(w: EngineModel, seq: Seq) -> None:
    """A chunk that left the prompt unfinished: an EXPORT request's full blocks can go."""
    publish_prefix(w, seq)
    if seq.mode == EXPORT:
        w.hooks.chunk_done(w, seq, seq.computed // w.bs)


def publish_prefix(w: EngineModel, seq: Seq) -> None:
    """Once its shared prefix is computed, a request's prefix blocks become the group's."""
    if seq.group < 0 or not seq.group_ref or seq.published:
        return
    full = min(seq.req.num_prefix_tokens, seq.req.num_prompt - 1) // w.bs
    if seq.num_prefix_blocks < full <= seq.computed // w.bs:
        # Blocks beyond what the group caches move from the request to the group.
        seq.num_prefix_blocks += w.pool.publish_group(seq.group, full)
        seq.published = True
