"""The robot side's client for the server (or any openpi policy server); ``vla.serve.executor`` runs its chunks.

client = PolicyClient("127.0.0.1", 8000, api_key=None)     # waits for the server; reconnects after restarts
executor = ChunkExecutor(client, control_hz=80, k=None)     # k=None: chosen from the measured round trip
rate = Rate(80)
obs = robot.observe()
executor.reset()
while running:
    robot.apply(executor.act(obs))                          # never blocks once the first chunk is in
    rate.sleep()
    obs = robot.observe()
"""

from __future__ import annotations

import inspect
import logging
import socket
import struct
import sys
import threading
import time
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from .codec import packb, unpackb
from .settings import ServeConfig

logger = logging.getLogger(__name__)


# websockets >= 15 reads HTTP(S)_PROXY (a robot talks to its server directly); >= 17 wants legacy=True to return the
# connection itself rather than a reconnecting iterator (we reconnect ourselves, and say so in the stats).
_CONNECT_EXTRAS = {
    k: v for k, v in {"proxy": None, "legacy": True}.items() if k in inspect.signature(connect).parameters
}


STATE_KEYS = ("observation.state", "observation/state", "state")  # where a state may be, as the server reads it


def bound_sends(sock: socket.socket, seconds: float) -> None:
    """A send that the peer does not take within ``seconds`` fails with ``BlockingIOError`` (``SO_SNDTIMEO``, which
    bounds sends only: the connection's reader thread still waits on receive as before). Windows spells the option's
    value another way; there sends stay unbounded."""
    if sys.platform == "win32" or not hasattr(socket, "SO_SNDTIMEO"):
        return
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))


class ServerError(RuntimeError):
    """The server answered a request with an error reply (the connection is still usable)."""


class PolicyClient:
    """openpi's client protocol (``WebsocketClientPolicy``), plus reconnection and timeouts.

    ``infer(obs)`` sends one observation (a dict of numpy arrays and strings) and returns the reply dict
    (``"actions"`` ``[T, D]``, ``"server_timing"``, ...); calls from several threads take turns on the connection.
    If the connection drops (a server restart), the next ``infer`` reconnects, waiting up to ``reconnect_timeout_s``,
    and sends the observation again; an error reply raises ``ServerError``; no reply within ``timeout_s`` raises
    ``TimeoutError`` (and the connection is renewed, so a late reply can never be read as the answer to a later
    request). Sending is bounded by ``timeout_s`` too (on Linux and macOS): an observation that a server which
    stopped reading cannot take raises ``TimeoutError`` instead of blocking until TCP gives up (minutes).
    """

    def __init__(
        self,
        host: str = ServeConfig.host,
        port: int | None = ServeConfig.port,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 30.0,
        reconnect_timeout_s: float = 10.0,
        max_message_bytes: int | None = 64 * 2**20,
    ):
        self.uri = host if host.startswith("ws") else f"ws://{host}"
        if port is not None:
            self.uri += f":{port}"
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.max_message_bytes = max_message_bytes
        self.reconnects = 0
        self._ws = None
        self._lock = threading.Lock()  # one request at a time on the connection, whichever thread asks
        self.metadata: dict = {}
        self._connect(connect_timeout_s)

    def _connect(self, wait_s: float) -> None:
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        deadline, delay = time.monotonic() + wait_s, 0.05
        options = dict(
            compression=None,
            max_size=self.max_message_bytes,
            additional_headers=headers,
            open_timeout=min(10.0, max(wait_s, 1.0)),
        )
        options.update(_CONNECT_EXTRAS)
        while True:
            try:
                ws = connect(self.uri, **options)
                bound_sends(ws.socket, self.timeout_s)
                self.metadata = unpackb(ws.recv(timeout=self.timeout_s))
                self._ws = ws
                return
            except InvalidStatus as err:
                status = err.response.status_code
                if status in (401, 403):
                    raise PermissionError(
                        f"{self.uri} refused the connection ({status}): pass the server's api_key"
                    ) from None
                body = (err.response.body or b"").decode("utf-8", "replace").strip()
                last = f"it answered HTTP {status}" + (f": {body}" if body else "")  # 503: which limit, and the fix
            except (OSError, ConnectionClosed, TimeoutError) as err:
                last = err
            if time.monotonic() + delay > deadline:
                raise ConnectionError(f"no policy server at {self.uri} after {wait_s:.0f} s: {last}")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        data = packb(obs)
        with self._lock:
            return self._round_trip(data)

    def _round_trip(self, data: bytes) -> dict[str, Any]:
        for attempt in range(2):
            if self._ws is None:
                self._connect(self.reconnect_timeout_s)
                self.reconnects += 1
            try:
                self._ws.send(data)
                reply = self._ws.recv(timeout=self.timeout_s)
            except TimeoutError:
                self._drop()
                raise TimeoutError(f"no reply from {self.uri} within {self.timeout_s} s") from None
            except (ConnectionClosed, OSError) as err:
                self._drop()
                if isinstance(err.__cause__, (BlockingIOError, TimeoutError)):  # bound_sends ran out
                    raise TimeoutError(
                        f"could not send to {self.uri} within {self.timeout_s} s: the server takes no more data "
                        "(stopped, or the network is down)"
                    ) from None
                if attempt:
                    raise ConnectionError(f"lost the connection to {self.uri} twice: {err}") from None
                continue
            if isinstance(reply, str):
                raise ServerError(reply.removeprefix("error: "))
            return unpackb(reply)
        raise AssertionError("unreachable")

    def get_server_metadata(self) -> dict:
        """The metadata the server sent on connect (openpi's name)."""
        return self.metadata

    def _drop(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:  # noqa: BLE001 - it is being discarded
                pass
        self._ws = None

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
