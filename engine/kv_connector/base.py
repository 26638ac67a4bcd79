"""The KV connector: how a request's KV enters or leaves this engine, behind one interface the
scheduler and the engine call at fixed points. The engine core knows no roles: a colocated
engine has the ``NullConnector``; a prefill worker's engine has a connector that ships
exported requests' blocks; a decode worker's engine has one that fills reserved blocks.

    scheduler, admitting a waiting request (engine thread)
        get_num_new_matched_tokens(request, num_local)  -> (num_external, is_async)
            tokens beyond the local prefix hit that arrive from elsewhere; async: the request
            waits in WAITING_FOR_REMOTE_KV holding its blocks until they are loaded
        update_state_after_alloc(request, block_ids, num_external)
            the blocks are allocated: e.g. open the reservation the remote side writes into
        request_finished(request, block_ids) -> delay_free
            the request left (finished or aborted); True: the connector still uses its blocks,
            the scheduler frees them only when the connector lists the id in ``freeable``

    engine, after every step
        save_kv(saves)   blocks of exporting requests that became complete in this step
    engine, before every step
        get_finished()   what completed meanwhile (any thread may have caused it): loads done
                         (with the first token sampled elsewhere), loads failed, blocks freeable

Only plain data crosses: ``KVTransferParams`` on the request, ``KVSave`` and
``KVConnectorOutput`` per step. A connector must call ``wake()`` (given by the engine) when it
has output for an engine that may be idle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.kv_connector.params import KVTransferParams
from engine.request import Request

__all__ = [
    "KVConnector",
    "KVConnectorOutput",
    "KVLoaded",
    "KVSave",
    "KVTransferParams",
    "NullConnector",
]


@dataclass(frozen=True)
class KVSave:
    """Prompt blocks of an exporting request that are complete after a step."""

    request_id: str
    block_indices: tuple[int, ...]  # positions in the prompt's block list
    block_ids: tuple[int, ...]  # this engine's blocks holding them
    is_last: bool  # the whole prompt is computed and the first token sampled
    first_token_id: int | None = None
    first_token_logprob: float | None = None


@dataclass(frozen=True)
class KVLoaded:
    """An importing request's KV is in its blocks; it continues from ``first_token_id``."""

    first_token_id: int
    first_token_logprob: float | None = None


@dataclass(frozen=True)
class KVConnectorOutput:
    loaded: dict[str, KVLoaded] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # import failed: id -> why
    freeable: frozenset[str] = frozenset()  # finished, delay-freed: the blocks may go now
    # failed imports: how many leading prompt tokens' KV arrived whole (cached as it fails)
    intact: dict[str, int] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.loaded and not self.failed and not self.freeable


class KVConnector(Protocol):
    def set_wakeup(self, wake: Callable[[], None]) -> None:
        """``wake()`` (thread-safe) makes an idle engine step; call it after new output."""
        ...

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """Prompt tokens past ``num_computed_tokens`` (the local prefix hit) that this
        connector provides, and whether they arrive asynchronously."""
        ...

    def update_state_after_alloc(
        self, request: Request, block_ids: Sequence[int], num_external_tokens: int
    ) -> None:
        """Blocks for a request with external tokens are allocated (``block_ids`` is its whole
        block table; the first ``num_computed`` tokens' blocks hold local hits)."""
        ...

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> bool:
        """The request finished or was aborted. Return True to keep its blocks until this
        connector lists it in ``freeable``."""
        ...

    def save_kv(self, saves: Sequence[KVSave]) -> None:
        """Ship these blocks (engine thread; must not block: hand the work off)."""
        ...

    def get_finished(self) -> KVConnectorOutput:
        """Everything completed since the last call (engine thread)."""
        ...

    def has_pending_output(self) -> bool:
        """True when ``get_finished`` would return something (thread-safe)."""
        ...


class NullConnector:
    """No KV crosses the engine (the colocated and offline engines)."""

    def set_wakeup(self, wake: Callable[[], None]) -> None:
        pass

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if request.kv_transfer is not None:
            raise ValueError("this engine has no KV connector for KV transfer requests")
        return 0, False

    def update_state_after_alloc(
        self, request: Request, block_ids: Sequence[int], num_external_tokens: int
    ) -> None:
        pass

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> bool:
        return False

    def save_kv(self, saves: Sequence[KVSave]) -> None:
        pass

    def get_finished(self) -> KVConnectorOutput:
        return KVConnectorOutput()

    def has_pending_output(self) -> bool:
        return False
