"""The disaggregated backend: decode workers hold the running batches, prefill workers compute
prompts and push their KV straight into the blocks decode reserved.

Per request:
    1. the cluster router (router.cluster_router) picks the (decode, prefill) pair with the
       routing policy over the workers' corrected loads and the cluster KV index, or decode
       alone (it prefills the prompt itself: no transfer), and reserves the decode worker;
    2. open the decode worker's Generate stream; its first message is either a reservation
       ticket or "local prefill" (it may come after heartbeats while decode waits for free
       blocks). A decode worker that refuses the request (busy, draining) before that first
       message: the next one in the ranking, before the client ever sees an error;
    3. with a ticket, call Prefill on the chosen prefill worker; it pushes KV chunk by chunk
       to the decode worker, renewing decode's lease while it works, and returns the first
       token;
    4. stream decode's token deltas back.

Every wait has a deadline or a heartbeat behind it: a decode stream that sends neither a
token nor a heartbeat for ``stall_timeout_s`` has stalled; the Prefill call has no deadline of
its own because the decode stream watches it (a prefill worker that stops renewing loses the
reservation within decode's lease, and decode's stream then fails).

A worker that fails a request it accepted (dies, stalls, drains, loses its KV) raises
``WorkerFailure``: the request migrates (router.migration) — routed again with the tokens
already streamed appended to the prompt, and the new workers resume it from there
(engine.resume), up to ``--migration-limit`` times. Any other failure is a
``RequestError``; leaving the generator cancels both calls, and the workers free their blocks
(see decode_service.service).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from engine.model_card import load_model_card, resolve_max_model_len
from engine.outputs import RequestOutput
from pdserve.tls import ClientTls
from pdserve.wire import OutputAccumulator, sampling_params_to_proto
from protos.pdserve.v1 import worker_pb2 as wpb
from router.backend import GenerateRequest, Load, ModelInfo, served_names
from router.cluster_router import ClusterRouter, Route
from router.errors import ErrorKind, RequestError
from router.migration import DEFAULT_MIGRATION_LIMIT, Migrations, MigrationStats, WorkerFailure
from router.routing import make_policy
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions, TokenizerOps
from router.worker_calls import WorkerCalls
from router.worker_errors import Refused

DEFAULT_STALL_TIMEOUT_S = 10.0
_AVOID_FAILED_S = 5.0  # a worker that lost a request gets no new one for this long

logger = logging.getLogger(__name__)


class DisaggregatedBackend:
    """Implements ``router.backend.Backend`` over gRPC prefill and decode worker pools."""

    def __init__(
        self,
        model: str,
        decode_targets: Sequence[str] = (),
        prefill_targets: Sequence[str] = (),
        served_model_name: str | Sequence[str] | None = None,
        block_size: int = 16,
        max_model_len: int | None = None,
        local_prefill_max_tokens: int = 0,
        load_poll_s: float = 0.1,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        routing_policy: str = "kv_aware",
        cluster: ClusterRouter | None = None,
        worker_tls: ClientTls | None = None,
        migration_limit: int = DEFAULT_MIGRATION_LIMIT,
        chat_template: str | None = None,
    ) -> None:
        """Workers come from ``cluster`` (e.g. ``ClusterRouter.redis``) or, without it, from
        the static ``decode_targets`` and ``prefill_targets``. ``stall_timeout_s``: a decode
        stream silent (no token, no heartbeat) this long fails its request; decode workers
        send a heartbeat every ``--heartbeat-s`` (1 s by default) while they have nothing
        else to send, so keep it well above that. ``local_prefill_max_tokens``: prompts up to
        this long may be prefilled on decode (-1: all; 0: only when decode caches most of
        the prompt, as the kv_aware policy judges). ``worker_tls``: dial static workers over
        mutual TLS (pdserve.tls; a given ``cluster`` brings its own). ``migration_limit``: how
        many times one request may move to other workers after the ones serving it failed
        (router.migration; 0: fail it instead). ``chat_template``: Jinja text that replaces
        the tokenizer's own."""
        if stall_timeout_s <= 0:
            raise ValueError(f"--stall-timeout-s must be positive, got {stall_timeout_s}")
        if migration_limit < 0:
            raise ValueError(f"--migration-limit must be >= 0, got {migration_limit}")
        if cluster is None:
            if not decode_targets or not prefill_targets:
                raise ValueError("need at least one decode and one prefill worker")
            policy = make_policy(
                routing_policy,
                **policy_options(routing_policy, local_prefill_max_tokens, block_size),
            )
            cluster = ClusterRouter.static(
                decode_targets,
                prefill_targets,
                policy,
                local_prefill_max_tokens,
                load_poll_s,
                tls=worker_tls,
            )
        mc = load_model_card(model)
        self._text = TokenizerOps(model, chat_template)
        names = served_names(served_model_name, mc.path)
        self._info = ModelInfo(
            model=names[0],
            architecture=mc.architecture,
            dtype=mc.dtype(),
            max_model_len=resolve_max_model_len(max_model_len, mc.max_position_embeddings),
            vocab_size=mc.vocab_size,
            block_size=block_size,
            eos_token_ids=tuple(mc.eos_token_ids),
            served_names=names,
            model_path=model,
        )
        self.cluster = cluster
        self._stall_timeout_s = stall_timeout_s
        self._migration_limit = migration_limit
        self.migration_stats = MigrationStats()
        self._aborted: set[str] = set()
        self._workers = WorkerCalls(cluster, stall_timeout_s, self._aborted)
        self._calls: dict[str, list[Any]] = {}

    async def start(self) -> None:
        """Learn the workers and start following them (call on the router's event loop)."""
        await self.cluster.start()

    # ------------------------------------------------------------------ Backend
    def model_info(self) -> ModelInfo:
        return self._info

    def load(self) -> Load:
        """Routable decode and prefill workers together (their latest load reports); a
        worker that stopped answering does not count."""
        return self.cluster.load()

    def is_healthy(self) -> bool:
        return self.cluster.num_routable("decode") > 0 and self.cluster.num_routable("prefill") > 0

    def healthy_workers(self) -> dict[str, int]:
        """Routable workers by pool (for metrics)."""
        return {
            "prefill": self.cluster.num_routable("prefill"),
            "decode": self.cluster.num_routable("decode"),
        }

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        ids = (
            list(request.prompt_token_ids)
            if request.prompt_token_ids is not None
            else self._tokenize_prompt(request.prompt)
        )
        rid = request.request_id
        acc = OutputAccumulator(rid, ids, request.prompt)
        migrations = Migrations(self._migration_limit, self.migration_stats)
        # The workers' (and the ledger's) id for this request: the client's id plus a tag of
        # its own, so that another request with the same id (a client's retry while the
        # workers still clean this one up, or the same id through another router) never meets
        # this one's calls, reservation or blocks there.
        worker_base = f"{rid}.{secrets.token_hex(4)}"
        failure: WorkerFailure | None = None
        decoded_on: list[str] = []  # each attempt's decode worker
        try:
            while True:
                streamed = len(acc.token_ids)
                # A failure that is not the decode worker's (the prefill worker died, stalled
                # or gave up) leaves on it the blocks that arrived whole: go back there.
                prefer = (
                    decoded_on[-1]
                    if failure is not None and decoded_on and failure.worker_id != decoded_on[-1]
                    else None
                )
                attempt = self._attempt(
                    request, worker_base, ids, acc, migrations, failure, prefer, decoded_on
                )
                try:
                    async with contextlib.aclosing(attempt):  # its calls end with this one
                        async for out in attempt:
                            yield out
                            if out.finished:
                                return
                except WorkerFailure as e:
                    if rid in self._aborted:
                        raise RequestError(
                            ErrorKind.UNAVAILABLE, "the request was aborted"
                        ) from None
                    if e.worker_id and e.reason != "worker_error":
                        # Soft: skipped while another worker can serve (a decode stall the
                        # router saw itself is marked strictly by WorkerCalls.read).
                        self.cluster.view.mark_failed(e.worker_id, for_s=_AVOID_FAILED_S)
                    phase = "decode" if len(acc.token_ids) > streamed else "prefill"
                    migrations.begin(e, phase)  # raises once the limit is reached
                    logger.warning(
                        "request %s: %s; migrating it (%s, %d tokens streamed, attempt %d of %d)",
                        rid, e.message, phase, len(acc.token_ids), migrations.count,
                        migrations.limit,
                    )  # fmt: skip
                    failure = e
        finally:
            self._calls.pop(rid, None)
            self._aborted.discard(rid)

    async def _attempt(
        self,
        request: GenerateRequest,
        worker_base: str,
        ids: list[int],
        acc: OutputAccumulator,
        migrations: Migrations,
        failure: WorkerFailure | None,
        prefer_decode: str | None,
        decoded_on: list[str],
    ) -> AsyncGenerator[RequestOutput, None]:
        """One try at the request on one (decode, prefill) pair: from the start, or, after a
        ``failure``, from the tokens ``acc`` already streamed (the workers resume it). The
        workers know it as ``worker_base`` (then ``<worker_base>.m<n>`` after n migrations).
        The decode worker it opens is appended to ``decoded_on``."""
        rid = request.request_id
        if rid in self._aborted:  # aborted between two attempts
            raise RequestError(ErrorKind.UNAVAILABLE, "the request was aborted")
        done = list(acc.token_ids)
        context = [*ids, *done]
        resume = wpb.Resume(num_generated_tokens=len(done), emitted_text=acc.text) if done else None
        n = migrations.count
        worker_rid = worker_base if n == 0 else f"{worker_base}.m{n}"
        try:
            route = await self.cluster.route(worker_rid, context, prefer_decode)
            route, call, first = await self._open_decode(
                route, request, context, resume, worker_rid
            )
            decoded_on.append(route.decode[0].worker_id)
        except RequestError as e:
            self._calls.pop(rid, None)
            if failure is not None and not isinstance(e, WorkerFailure):
                raise migrations.impossible(failure, e) from None
            raise
        decode = route.decode[0]
        self._calls[rid] = [call]
        prefill: asyncio.Task[wpb.PrefillResponse] | None = None
        try:
            if first.HasField("reservation"):
                if route.is_local:
                    raise RequestError(
                        ErrorKind.INTERNAL, f"decode worker {decode.address} did not prefill"
                    )
                prefill = asyncio.ensure_future(
                    self._workers.prefill(
                        request, worker_rid, context, resume, first, route.prefill[0]
                    )
                )
                self._calls[rid].append(prefill)
                msg = await self._workers.read_while_prefilling(
                    call, decode, rid, prefill, route.prefill[0]
                )
            else:
                msg = await self._workers.read(call, decode, rid)
            first_output = True
            while msg is not None:
                if first_output and prefill is not None and msg.output.logprobs:
                    # Only prefill saw the first token's whole distribution: decode got the
                    # token and its logprob over the KV channel; take the top-n from prefill.
                    response = await self._workers.prefill_response(prefill)
                    msg.output.logprobs[0].top_logprobs.extend(response.first_token_top_logprobs)
                first_output = False
                out = acc.add(msg.output)
                yield out
                if out.finished:
                    return
                msg = await self._workers.read(call, decode, rid)
            raise WorkerFailure(
                f"decode worker {decode.address} ended the stream before the request finished",
                "worker_lost",
                decode.worker_id,
            )
        finally:
            call.cancel()
            await self.cluster.release(route)
            if prefill is not None:
                if not prefill.done():
                    prefill.cancel()
                with contextlib.suppress(BaseException):
                    await prefill  # also retrieves a failure nobody else looked at

    def abort(self, request_id: str) -> None:
        calls = self._calls.get(request_id)
        if calls is not None:
            self._aborted.add(request_id)
            for c in calls:
                c.cancel()

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._text.tokenize(text, add_special_tokens)

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return self._text.token_strings(token_ids)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        return self._text.render_chat(messages, tools, options)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._text.detokenize(token_ids)

    async def close(self) -> None:
        await self.cluster.close()

    # ----------------------------------------------------------------- private
    def _tokenize_prompt(self, prompt: str | None) -> list[int]:
        if not prompt:
            raise ValueError("prompt must not be empty")
        return self.tokenize(prompt)

    async def _open_decode(
        self,
        route: Route,
        request: GenerateRequest,
        ids: list[int],
        resume: wpb.Resume | None,
        worker_rid: str,
    ) -> tuple[Route, Any, wpb.DecodeMessage]:
        """Open the Generate stream on the route's decode worker and read its first message;
        a worker that refuses (busy, draining, unreachable) before it: the next one."""
        rid = request.request_id
        while True:
            decode = route.decode[0]
            call = decode.stub.Generate(
                wpb.WorkerGenerateRequest(
                    request_id=worker_rid,
                    prompt_token_ids=ids,
                    sampling_params=sampling_params_to_proto(request.sampling_params),
                    priority=request.priority,
                    local_prefill_max_tokens=-1 if route.is_local else 0,
                    resume=resume,
                )
            )
            self._calls[rid] = [call]
            try:
                first = await self._workers.read(call, decode, rid, first=True)
            except Refused as e:
                call.cancel()
                retry = await self.cluster.retry_decode(route)
                if retry is None:
                    await self.cluster.release(route)
                    # Every ranked decode worker refused: unreachable or draining ones
                    # (a WorkerFailure) send it through migration, which routes it anew
                    # without them; busy ones (BUSY) fail it with 429.
                    raise e.error from None
                route = retry
                continue
            except BaseException:
                call.cancel()
                await self.cluster.release(route)
                raise
            if first is None:
                call.cancel()
                await self.cluster.release(route)
                raise WorkerFailure(
                    f"decode worker {decode.address} closed the stream",
                    "worker_lost",
                    decode.worker_id,
                )
            return route, call, first


def policy_options(name: str, local_prefill_max_tokens: int, block_size: int) -> dict[str, float]:
    """The routing policy's options from the router's flags."""
    if name != "kv_aware":
        return {"local_prefill_max_tokens": local_prefill_max_tokens}
    blocks = 10**9 if local_prefill_max_tokens < 0 else local_prefill_max_tokens // block_size
    return {"local_prefill_max_blocks": blocks}
