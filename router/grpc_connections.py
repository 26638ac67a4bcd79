"""How the router's public gRPC server keeps and ends connections: HTTP/2 keepalive both ways,
and a maximum connection age.

Keepalive.

A call can be silent for a long time: a request waiting in the queue, or behind a long prompt's
prefill, sends nothing until its first token. gRPC's server default takes a client's keepalive
ping on a connection without data as abuse if it comes more often than every 5 minutes, and
after two strikes closes the connection with GOAWAY ``too_many_pings``, failing every call on it
with UNAVAILABLE. A client that pings every 10-30 s (grpc-go's floor is 10 s; proxies and
load balancers set such values to keep idle connections open) thus lost a queued request
after three pings. Here clients may ping as often as ``min_client_ping_s``, also with no call
open (their idle pooled connections), which is what they need and what gRPC's policy still
bounds.

The server pings too: a client that stops answering (its host gone, its process hung) has its
connection closed after ``time_s + timeout_s`` and its calls cancelled, so a request it will
never read leaves the queue and the KV pool instead of running to its last token. The pings
also keep an idle connection open through NAT and load balancers that drop quiet flows.

Connection age. A gRPC client holds one HTTP/2 connection for as long as it can, so behind a
Kubernetes Service (which balances connections, not calls) every client stays on the router
replica it first reached: replicas the autoscaler adds get no gRPC traffic. After
``max_age_s`` (grpc adds up to 10% jitter) the server sends GOAWAY: the client opens a new
connection, through the Service, for its next calls, while calls in flight finish on the old one
(no grace limit: a long generation is never cut).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrpcConnectionPolicy:
    time_s: float = 60.0  # ping a client whose connection was quiet this long (0 = never)
    timeout_s: float = 20.0  # ... and close it when the ping is not answered within this
    min_client_ping_s: float = 5.0  # a client's pings this close are accepted (closer: strikes)
    max_age_s: float = 1800.0  # GOAWAY a connection this old, to rebalance clients (0: never)

    def __post_init__(self) -> None:
        flags = {
            "time_s": "--grpc-keepalive-s",
            "timeout_s": "--grpc-keepalive-timeout-s",
            "min_client_ping_s": "--grpc-min-client-ping-s",
            "max_age_s": "--grpc-max-connection-age-s",
        }
        for name, flag in flags.items():
            value = getattr(self, name)
            if not 0 <= value <= 86400:  # also NaN; grpc takes milliseconds as an int32
                raise ValueError(f"{flag} must be between 0 and 86400 seconds, got {value}")
        if self.time_s > 0 and self.timeout_s <= 0:
            raise ValueError("--grpc-keepalive-timeout-s must be > 0 when the server pings")

    def server_options(self) -> list[tuple[str, int]]:
        """grpc channel arguments for ``grpc.aio.server(options=...)``."""
        never = 2**31 - 1  # grpc's "infinite" for a millisecond argument
        time_ms = int(self.time_s * 1000) if self.time_s > 0 else never
        return [
            ("grpc.keepalive_time_ms", time_ms),
            ("grpc.keepalive_timeout_ms", int(self.timeout_s * 1000)),
            # What grpc 1.85 times a keepalive ping by: without it an unanswered ping waits
            # its 60 s default whatever keepalive_timeout_ms says (measured).
            ("grpc.http2.ping_timeout_ms", int(self.timeout_s * 1000)),
            # Ping idle connections too, and take clients' pings on them.
            ("grpc.keepalive_permit_without_calls", 1),
            # The server's own pings are not limited to two between data frames, so a silent
            # call (a queued request) is still watched.
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.min_client_ping_s * 1000)),
            ("grpc.max_connection_age_ms", int(self.max_age_s * 1000) if self.max_age_s else never),
        ]
