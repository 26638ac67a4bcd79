"""The router's picture of the cluster: members, their latest load, its own recent sends, and
the KV index. Fed by a source (``redis_source`` or ``static_source``); read by routing.

Load correction (so a burst spreads before the next report arrives):

    used blocks seen = report.used + blocks this router sent there that the report may not
                       show yet (sent after it, or less than ``visible_after_s`` before it)
    (report older than ``stale_after_s``, or none: this router's in-flight sends alone)

Not thread-safe: the router's event loop owns it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass

from control_plane.kv_events import KVIndex
from control_plane.load_report import STALE_AFTER_S, LoadReport
from control_plane.stats import ControlPlaneStats
from control_plane.worker_info import ModelFingerprint, WorkerInfo, WorkerRole, WorkerState

logger = logging.getLogger(__name__)


@dataclass
class _Send:
    sent_at: float  # registry clock
    num_blocks: int
    num_prefill_tokens: int


@dataclass(frozen=True)
class WorkerLoadView:
    """One worker as routing sees it now."""

    info: WorkerInfo
    report: LoadReport | None
    is_stale: bool
    num_used_blocks: int
    num_active_requests: int  # running + waiting (+ this router's unreported sends)
    num_queued_prefill_tokens: int
    num_inflight: int  # requests this router has in flight there

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    @property
    def num_free_blocks(self) -> int:
        return max(0, self.info.num_blocks - self.num_used_blocks)


class ClusterView:
    def __init__(
        self,
        fingerprint: ModelFingerprint | None = None,
        stale_after_s: float = STALE_AFTER_S,
        visible_after_s: float = 0.5,
        stats: ControlPlaneStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        adopt_fingerprint: bool = False,
    ) -> None:
        """``fingerprint``: members must match it (others are refused and logged once);
        None with ``adopt_fingerprint``: the first member's becomes the one to match."""
        self.fingerprint = fingerprint
        self.adopt_fingerprint = adopt_fingerprint
        self.stale_after_s = stale_after_s
        self.visible_after_s = visible_after_s  # a send shows in reports this much later
        self.stats = stats or ControlPlaneStats()
        self.kv_index = KVIndex()
        self.in_outage = False  # set by the source: leases cannot be judged, keep what we know
        self._clock = clock
        self._offset = 0.0  # registry clock - local clock
        self._members: dict[str, WorkerInfo] = {}
        self._refused: set[str] = set()  # fingerprint mismatches already logged
        self._loads: dict[str, LoadReport] = {}
        self._sends: dict[str, dict[str, _Send]] = {}  # worker -> request id -> send
        # worker -> (avoided until, local clock; even as the last of its pool)
        # worker id -> (avoided while another can serve until, avoided even as the last until)
        self._avoided: dict[str, tuple[float, float]] = {}

    # ------------------------------------------------------------------ clock
    def sync_clock(self, registry_now: float) -> None:
        self._offset = registry_now - self._clock()

    def registry_time(self) -> float:
        return self._clock() + self._offset

    # ------------------------------------------------------------------ membership
    def set_members(self, infos: Iterable[WorkerInfo], keep: Set[str] = frozenset()) -> None:
        """Replace the membership with a full listing (a re-list). A member of ``keep`` the
        listing lacks stays while the lease it last held lasts (Redis lost its data: the
        member is about to register again, it did not leave)."""
        fresh = {i.worker_id: i for i in infos}
        now = self.registry_time()
        for gone in set(self._members) - set(fresh):
            deadline = self._members[gone].lease_deadline
            if gone in keep and deadline and deadline > now:
                continue
            self.remove_member(gone)
        for info in fresh.values():
            self.upsert_member(info)

    def upsert_member(self, info: WorkerInfo) -> None:
        old = self._members.get(info.worker_id)
        if old is not None and old.epoch != info.epoch:
            # Another registration under the same id (a restarted process, or Redis lost
            # its records and the worker registered again): its cache and load are new.
            self.kv_index.remove_worker(info.worker_id)
            self._loads.pop(info.worker_id, None)
        if self.fingerprint is None and self.adopt_fingerprint:
            self.fingerprint = info.fingerprint  # the first member sets the cluster's layout
        if self.fingerprint is not None:
            why = self.fingerprint.mismatch(info.fingerprint)
            if why is not None:
                if info.worker_id not in self._refused:
                    self._refused.add(info.worker_id)
                    self.stats.fingerprint_mismatches += 1
                    logger.error(
                        "refusing worker %s (%s at %s): %s",
                        info.worker_id,
                        info.role,
                        info.grpc_address,
                        why,
                    )
                return
        self._refused.discard(info.worker_id)
        if old is None:
            logger.info(
                "worker joined: %s %s at %s (epoch %d)",
                info.role,
                info.worker_id,
                info.grpc_address,
                info.epoch,
            )
        self._members[info.worker_id] = info

    def remove_member(self, worker_id: str) -> None:
        info = self._members.pop(worker_id, None)
        if info is not None:
            logger.info("worker left: %s %s", info.role, worker_id)
        self._loads.pop(worker_id, None)
        self._avoided.pop(worker_id, None)
        self.kv_index.remove_worker(worker_id)

    def member(self, worker_id: str) -> WorkerInfo | None:
        return self._members.get(worker_id)

    def members(self, role: WorkerRole | None = None) -> list[WorkerInfo]:
        return [m for m in self._members.values() if role is None or m.role == role]

    def routable(self, role: WorkerRole) -> list[WorkerInfo]:
        """Serving members of ``role`` whose lease is live (unless Redis is out) and that did
        not stall in the last few seconds, less those that failed a call lately
        (``mark_failed``) while another can serve: avoiding every member would fail requests
        a worker may well serve (one failed call is often the request's, not the worker's).
        A stalled worker answers nothing: it is avoided even as the last one."""
        now_local, now_reg = self._clock(), self.registry_time()
        live, fine = [], []
        for m in self.members(role):
            if m.state is not WorkerState.SERVING:
                continue
            if not self.in_outage and m.lease_deadline and m.lease_deadline <= now_reg:
                continue
            soft_until, hard_until = self._avoided.get(m.worker_id, (0.0, 0.0))
            if hard_until <= now_local:
                live.append(m)
                if soft_until <= now_local:
                    fine.append(m)
        return fine or live

    def mark_failed(self, worker_id: str, for_s: float = 2.0, stalled: bool = False) -> None:
        """A call to the worker failed: skip it for ``for_s`` while another worker can serve;
        ``stalled`` (it answered nothing, not even heartbeats): skip it even as the last. A
        mark never shortens or softens one in force (a stalled worker whose load poll then
        times out stays avoided even as the last until its stall mark passes)."""
        soft_until, hard_until = self._avoided.get(worker_id, (0.0, 0.0))
        until = self._clock() + for_s
        if stalled:
            hard_until = max(hard_until, until)
        soft_until = max(soft_until, until)
        self._avoided[worker_id] = (soft_until, hard_until)

    def mark_ok(self, worker_id: str) -> None:
        self._avoided.pop(worker_id, None)

    # ------------------------------------------------------------------ load
    def update_load(self, report: LoadReport) -> None:
        if report.worker_id not in self._members:
            return
        old = self._loads.get(report.worker_id)
        if old is not None and old.epoch == report.epoch and old.seq >= report.seq:
            return  # out of order
        self._loads[report.worker_id] = report

    def load_of(self, worker_id: str) -> LoadReport | None:
        return self._loads.get(worker_id)

    def sent(
        self, worker_id: str, request_id: str, num_blocks: int, num_prefill_tokens: int = 0
    ) -> None:
        """This router sent ``request_id`` to ``worker_id`` (count it until the worker's own
        report includes it, or until ``finished``)."""
        self._sends.setdefault(worker_id, {})[request_id] = _Send(
            self.registry_time(), num_blocks, num_prefill_tokens
        )

    def finished(self, worker_id: str, request_id: str) -> None:
        sends = self._sends.get(worker_id)
        if sends is not None:
            sends.pop(request_id, None)

    def view(self, worker_id: str) -> WorkerLoadView:
        info = self._members[worker_id]
        report = self._loads.get(worker_id)
        now = self.registry_time()
        stale = report is None or report.is_stale(now, self.stale_after_s)
        sends = list(self._sends.get(worker_id, {}).values())
        if report is not None and not stale:
            seen = report.timestamp - self.visible_after_s
            unreported = [s for s in sends if s.sent_at > seen]
            used = report.num_used_blocks + sum(s.num_blocks for s in unreported)
            active = report.num_running_requests + report.num_waiting_requests + len(unreported)
            queued = report.num_queued_prefill_tokens + sum(
                s.num_prefill_tokens for s in unreported
            )
        else:
            if report is not None:
                self.stats.stale_load_reports += 1
            used = sum(s.num_blocks for s in sends)
            active = len(sends)
            queued = sum(s.num_prefill_tokens for s in sends)
        return WorkerLoadView(
            info=info,
            report=report,
            is_stale=stale,
            num_used_blocks=min(info.num_blocks, used),
            num_active_requests=active,
            num_queued_prefill_tokens=queued,
            num_inflight=len(sends),
        )

    def views(self, role: WorkerRole) -> list[WorkerLoadView]:
        return [self.view(m.worker_id) for m in self.routable(role)]

    def registry_size(self) -> dict[tuple[str, str], int]:
        """Members by (role, state) for the metrics."""
        sizes: dict[tuple[str, str], int] = {}
        for m in self._members.values():
            key = (m.role, m.state.value)
            sizes[key] = sizes.get(key, 0) + 1
        return sizes
