"""What ``vla serve`` is set to (``ServeConfig``: every field a ``vla serve`` option) and what it counts
(``ServerStats``: connections, requests, errors, batches)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServeConfig:
    """How ``vla serve`` listens and batches. Every field is a ``vla serve`` option of the same name."""

    host: str = "127.0.0.1"  # localhost only by default; "0.0.0.0" to accept robots on the network
    port: int = 8000  # openpi's default; 0 picks a free port (tests)
    api_key: str | None = None  # require "Authorization: Api-Key <key>" on connect (openpi's client sends it)
    max_batch: int = 16  # most observations decoded in one call
    batch_window_ms: float = 2.0  # after the first request, wait this long for others arriving together
    max_queue: int = 64  # requests waiting for the policy; one more is answered "busy" at once
    request_timeout_s: float = 10.0  # a request not answered by then gets an error reply (and is skipped)
    max_message_bytes: int = 8 * 2**20  # larger messages close the connection (code 1009); 8 MiB fits 20 VGA images
    max_clients: int = 64  # connections beyond this are refused with 503
    # connections from one address beyond this are refused with 503, so one address cannot hold every slot; None =
    # half of max_clients (rounded up). Robots behind one NAT or proxy share an address: raise it to max_clients
    max_clients_per_ip: int | None = None
    idle_timeout_s: float = (
        60.0  # a connection that sends nothing for this long is closed (code 1008), freeing its slot
    )
    # n_obs_steps > 1, one state a message: a gap longer than this between a connection's messages starts its state
    # history again (a new episode), as a message with "reset": true does
    history_reset_s: float = 5.0
    keys: dict[str, str] = field(default_factory=dict)  # client key -> policy key, for robots with their own names

    def __post_init__(self) -> None:
        checks = [
            ("port", 0 <= self.port <= 65535, "use 0..65535 (0 = any free port)"),
            ("max_batch", self.max_batch >= 1, "use at least 1"),
            ("batch_window_ms", self.batch_window_ms >= 0, "use 0 or more milliseconds"),
            ("max_queue", self.max_queue >= 1, "use at least 1"),
            ("request_timeout_s", self.request_timeout_s > 0, "use a positive number of seconds"),
            ("max_message_bytes", self.max_message_bytes >= 1024, "use at least 1024 bytes"),
            ("max_clients", self.max_clients >= 1, "use at least 1"),
            (
                "max_clients_per_ip",
                self.max_clients_per_ip is None or 1 <= self.max_clients_per_ip <= self.max_clients,
                f"use 1..max_clients ({self.max_clients}), or None for half of max_clients",
            ),
            ("idle_timeout_s", self.idle_timeout_s > 0, "use a positive number of seconds"),
            ("history_reset_s", self.history_reset_s > 0, "use a positive number of seconds"),
            ("api_key", self.api_key is None or len(self.api_key) >= 8, "use a key of at least 8 characters"),
        ]
        for name, ok, fix in checks:
            if not ok:
                raise ValueError(f"ServeConfig.{name} = {getattr(self, name)!r} is invalid: {fix}")

    @property
    def per_ip(self) -> int:
        """The most connections one address may hold."""
        return self.max_clients_per_ip or -(-self.max_clients // 2)


@dataclass
class ServerStats:
    connections: int = 0  # open now
    connections_total: int = 0
    refused: int = 0  # connections refused with 503 (or closed with 1013 when a burst overtook the check)
    idle_closed: int = 0  # connections closed for sending nothing within idle_timeout_s
    requests: int = 0  # answered with actions
    errors: int = 0  # answered with an error reply
    timeouts: int = 0
    busy: int = 0  # refused because the queue was full
    dropped: int = 0  # decoded for a client that had gone or timed out
    nonfinite: int = 0  # chunks holding NaN or inf, answered with an error instead
    batches: int = 0
    batch_sizes: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "batch_sizes"}
        d["batch_sizes"] = {str(k): v for k, v in sorted(self.batch_sizes.items())}
        return d
