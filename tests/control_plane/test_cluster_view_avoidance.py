"""A worker that just failed a call is avoided for a few seconds, but never so that a pool
with live members has none to route to: with every member avoided, they are all routable
(the abort storm's single prefill worker, avoided after one failed call, made every request
of the next five seconds fail with "no prefill worker is available (1 known, 0 accepting)").
A stalled worker (it answers nothing) is avoided even as the last one."""

from __future__ import annotations

from control_plane.cluster_view import ClusterView
from control_plane.worker_info import WorkerState
from tests.control_plane.test_registry_redis import FP, info


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ids(view: ClusterView, role: str = "prefill") -> list[str]:
    return sorted(m.worker_id for m in view.routable(role))  # type: ignore[arg-type]


def test_an_avoided_worker_is_skipped_while_another_can_serve() -> None:
    clock = Clock()
    view = ClusterView(FP, clock=clock)
    view.set_members([info("p1", "prefill"), info("p2", "prefill"), info("d1")])
    view.mark_failed("p1", for_s=5.0)
    assert _ids(view) == ["p2"]
    clock.now += 5.1
    assert _ids(view) == ["p1", "p2"]


def test_when_every_member_is_avoided_they_all_stay_routable() -> None:
    clock = Clock()
    view = ClusterView(FP, clock=clock)
    view.set_members([info("p1", "prefill"), info("p2", "prefill"), info("d1")])
    view.mark_failed("p1", for_s=5.0)
    view.mark_failed("p2", for_s=5.0)
    assert _ids(view) == ["p1", "p2"]
    assert _ids(view, "decode") == ["d1"]  # another pool is not affected


def test_a_draining_member_is_never_routable_even_as_the_last_one() -> None:
    view = ClusterView(FP, clock=Clock())
    view.set_members([info("p1", "prefill").with_state(WorkerState.DRAINING)])
    view.mark_failed("p1", for_s=5.0)
    assert _ids(view) == []


def test_a_stalled_worker_is_avoided_even_as_the_last_one() -> None:
    clock = Clock()
    view = ClusterView(FP, clock=clock)
    view.set_members([info("d1"), info("d2")])
    view.mark_failed("d1", for_s=5.0, stalled=True)
    view.mark_failed("d2", for_s=5.0)
    assert _ids(view, "decode") == ["d2"]
    clock.now += 5.1
    assert _ids(view, "decode") == ["d1", "d2"]


def test_a_softer_mark_does_not_undo_a_stall_mark_in_force() -> None:
    """The router saw the last decode worker stall (avoided even as the last); the static
    source's load poll then timed out and marked it softly: it must stay out of routing
    (CI: three more migrations onto the stopped worker instead of a clear error)."""
    clock = Clock()
    view = ClusterView(FP, clock=clock)
    view.set_members([info("d1")])
    view.mark_failed("d1", for_s=5.0, stalled=True)
    view.mark_failed("d1", for_s=float("inf"))
    assert _ids(view, "decode") == []
    clock.now += 5.1
    assert _ids(view, "decode") == ["d1"]  # soft now: routable as the last one
    view.mark_failed("d1", for_s=1.0, stalled=True)
    clock.now += 1.1
    view.set_members([info("d1"), info("d2")])
    assert _ids(view, "decode") == ["d2"]  # the soft mark (no end) still holds
    view.mark_ok("d1")
    assert _ids(view, "decode") == ["d1", "d2"]
