"""Routing policies: which decode worker (and which prefill worker, or none) serves a request.

Pure functions of plain data (``RouteCandidate``s built from the router's ``ClusterView``), so
the unit tests and the cluster simulator run the very objects the router runs.
"""

from router.routing.policy import (
    POLICY_NAMES,
    NoWorkerError,
    PolicyName,
    RouteCandidate,
    RouteChoice,
    RouteRequest,
    RoutingPolicy,
    make_policy,
)

__all__ = [
    "POLICY_NAMES",
    "NoWorkerError",
    "PolicyName",
    "RouteCandidate",
    "RouteChoice",
    "RouteRequest",
    "RoutingPolicy",
    "make_policy",
]
