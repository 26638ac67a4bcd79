"""What a request carries when its KV crosses the engine's boundary (plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

KVRole = Literal["export", "import"]


@dataclass(frozen=True)
class KVTransferParams:
    """``export``: compute the prompt here and ship its KV out (the prefill role); the request
    samples only the first token, takes its whole prompt's blocks at admission and is never
    preempted. ``import``: the prompt's KV arrives from elsewhere (the decode role) with the
    first token. ``peer`` is the connector's own plain data (e.g. the reservation ticket)."""

    role: KVRole
    peer: Any = None
