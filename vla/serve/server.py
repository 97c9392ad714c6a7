"""The policy server: openpi's websocket protocol, with requests from concurrent clients decoded as one batch.

    server = PolicyServer(VLAPolicy.from_pretrained(path), ServeConfig(port=8000))
    server.run()                               # blocks; `vla serve --policy PATH` does this
    handle = server.start_in_thread()          # tests and benchmarks: handle.port, handle.stop()

The protocol (``openpi_client.websocket_client_policy.WebsocketClientPolicy`` drives it unchanged):
- ``GET /healthz`` answers 200 without a handshake; anything else is a websocket handshake (an ``Authorization:
  Api-Key <key>`` header is required when the server has a key: 401 without it, as openpi's client sends it).
  503 when ``max_clients`` connections are open, or ``max_clients_per_ip`` from the caller's address.
- On connect the server sends its metadata (a msgpack map: the policy's shapes, the keys it reads, the state history
  it accepts, the limits).
- Each binary message is one observation (msgpack-numpy, ``vla.serve.codec``); each reply is a msgpack map
  ``{"actions": float32 [T, D] (raw units), "server_timing": {"infer_ms", "queue_ms", "batch_size", "total_ms",
  "prev_total_ms"}, "valid": bool, "tokens": int}`` plus ``"request_id"`` when the observation carried one, and
  ``"history_frames"`` when the server keeps the state history (below).
- A connection that sends nothing for ``idle_timeout_s`` is closed (code 1008), so silent clients cannot hold the
  slots; ``PolicyClient`` reconnects on its next request.
- A request that cannot be served (a malformed or oversize-for-the-policy observation, a full queue, a timeout) is
  answered with a text frame ``"error: <what and how to fix it>"``, on which openpi's client raises, and the
  connection stays open for the next observation (openpi's server sends the traceback and closes it). Messages over
  ``max_message_bytes`` close the connection with websocket code 1009 (the limit is enforced while reading).

Observation keys (after ``config.keys`` renames ``client key -> policy key`` and ``/`` is read as ``.``, so openpi-style
``observation/state`` works): the state ``observation.state`` (or ``state``) as ``[S]`` numbers; each of the policy's
cameras ``observation.images.<cam>`` (or ``images.<cam>``; ``image`` / ``observation.image`` for a one-camera policy)
as uint8 ``[H, W, 3]`` (openpi's layout) or ``[3, H, W]``, or floats in [0, 1]; the instruction ``prompt`` (openpi's
name) or ``task``. Images are resized on the server to the policy's size, so robots may send any resolution.

State history (a policy with ``n_obs_steps`` = n > 1): a message carries either the last n states ``[n, S]``, oldest
first (the robot keeps them at its control rate: ``ChunkExecutor`` does), or one state ``[S]``, and then the server
keeps the connection's last n states (``ConnectionHistory``: the episode's first repeated until there are n; started
again by a message with ``"reset": true`` and after ``history_reset_s`` without a message).

Reading: each message is decoded and checked (``codec.unpackb``, ``ObservationReader``: cameras resized) in a small
pool of reader threads, never on the event loop, and the codec bounds what one message may hold (keys, list
lengths, values, nesting), so one client's large or many-keyed message cannot stall the others' replies.

Batching: one worker takes every request queued when it becomes free (waiting ``batch_window_ms`` after the first
for others that arrive together), up to ``max_batch``, and runs them as one ``predict_action_chunk`` call in a worker
thread, so the event loop keeps reading, answering health checks and timing out requests meanwhile. The queue is
bounded (``max_queue``: a full queue answers "busy" at once rather than letting latency grow without bound); a
request that times out or whose client vanished is skipped if not yet decoded and its result dropped if it was; a
slow reader only ever blocks its own connection. If a batched call raises, its requests are retried one by one so
that one bad observation fails alone. A chunk holding NaN or inf is never sent: its request gets an error reply
(counted as ``nonfinite`` in ``/stats``), the batch's other chunks are sent as usual.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from .codec import DecodeError, packb, unpackb
from .observation import COMMITTED, RESET_KEY, ConnectionHistory, Item, ObservationReader, RequestError
from .settings import ServeConfig, ServerStats

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
READ_THREADS = 4  # threads decoding and checking messages, off the event loop


@dataclass
class Pending:
    item: Item
    future: asyncio.Future
    queued_at: float


@dataclass
class Result:
    actions: np.ndarray  # float32 [T, D]
    valid: bool
    tokens: int
    infer_ms: float  # the whole batched call this request was part of
    queue_ms: float
    batch_size: int


class PolicyServer:
    """Serves ``policy`` (anything with ``config`` and ``predict_action_chunk(batch) -> [B, T, D]``, e.g. a
    ``VLAPolicy``) over websockets; see the module docstring for the protocol."""

    def __init__(self, policy, config: ServeConfig | None = None):
        self.policy = policy
        self.config = config or ServeConfig()
        c = policy.config
        image_size = getattr(c, "image_size", None) or getattr(getattr(policy, "model", None), "image_size", None)
        self.obs_steps = int(getattr(c, "n_obs_steps", 1) or 1)
        commits = _decodes_after_committed(policy)
        self.reader = ObservationReader(
            c.state_dim,
            list(c.image_keys),
            image_size,
            self.config.keys,
            self.obs_steps,
            committed=(int(c.time_horizon), int(c.action_dim)) if commits else None,
        )
        self.stats = ServerStats()
        self._per_ip: Counter = Counter()  # open connections per remote address
        self.metadata = {
            "server": "vla serve",
            "protocol": PROTOCOL_VERSION,
            "policy": {
                "time_horizon": int(c.time_horizon),
                "n_action_steps": int(c.n_action_steps),
                "action_dim": int(c.action_dim),
                "state_dim": int(c.state_dim),
                "image_keys": list(c.image_keys),
                "image_size": image_size,
                "n_obs_steps": self.obs_steps,
                "committed_actions": self.reader.committed is not None,  # decodes after the actions sent with a request
            },
            "observation": self.reader.expected(),
            "history": {  # how to send a policy that reads the last n states (n_obs_steps = n > 1) its history
                "n_obs_steps": self.obs_steps,
                "state_shapes": self.reader.state_shapes(),  # [S]: the server keeps the last n; [n, S]: the client does
                "order": "oldest first; the episode's first state repeated until there are n",
                "reset_key": RESET_KEY,  # true on an episode's first observation: the server's history starts again
                "reset_after_idle_s": self.config.history_reset_s,  # a longer gap between messages starts it too
                "spacing": "one state a message: the frames are successive messages, as far apart as training's "
                "only when the robot sends every control step; else send [n, S] (ChunkExecutor does)",
            },
            "limits": {
                "max_batch": self.config.max_batch,
                "max_queue": self.config.max_queue,
                "request_timeout_s": self.config.request_timeout_s,
                "max_message_bytes": self.config.max_message_bytes,
                "max_clients": self.config.max_clients,
                "max_clients_per_ip": self.config.per_ip,
                "idle_timeout_s": self.config.idle_timeout_s,
            },
        }
        self._queue: asyncio.Queue[Pending] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # the inference thread, while serving
        self._readers: concurrent.futures.ThreadPoolExecutor | None = None  # the message readers, while serving

    # --- inference (worker thread) -------------------------------------------------------------------------
    def _predict(self, items: list[Item]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One batched call: actions float32 [B, T, D], valid bool [B], tokens int [B]."""
        batch: dict[str, Any] = {"task": [it.task for it in items]}
        if items[0].state is not None:  # None: an image-only policy (state_dim 0)
            batch["observation.state"] = torch.stack([it.state for it in items])
        for key in self.reader.image_keys:
            batch[key] = torch.stack([it.images[key] for it in items])
        if any(it.committed is not None for it in items):  # committed-prefix decoding, row by row (none: free)
            batch[COMMITTED] = [it.committed if it.committed is not None else () for it in items]
        with torch.inference_mode():
            chunks = self.policy.predict_action_chunk(batch)
        actions = chunks.detach().float().cpu().numpy() if hasattr(chunks, "detach") else np.asarray(chunks, np.float32)
        if actions.ndim != 3 or len(actions) != len(items):
            raise RuntimeError(f"the policy returned shape {list(actions.shape)} for {len(items)} observations")
        info = getattr(self.policy, "last_decode_info", None)
        valid = np.ones(len(items), dtype=bool)
        tokens = np.zeros(len(items), dtype=np.int64)
        if info is not None:
            valid = np.asarray(info["valid"], dtype=bool).reshape(-1)[: len(items)]
            tokens = np.asarray(info["tokens_per_chunk"]).reshape(-1)[: len(items)]
        return actions.astype(np.float32, copy=False), valid, tokens

    async def _run_batch(self, batch: list[Pending]) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            actions, valid, tokens = await loop.run_in_executor(self._pool, self._predict, [p.item for p in batch])
        except Exception as err:  # noqa: BLE001 - any failure is reported to its requests, never kills the worker
            if len(batch) > 1:  # isolate the observation that fails (not those whose clients stopped waiting)
                for p in batch:
                    if not p.future.done():
                        await self._run_batch([p])
                return
            logger.warning("inference failed: %s", err)
            if not batch[0].future.done():
                batch[0].future.set_exception(RequestError(f"the policy could not act on this observation: {err}"))
            return
        infer_ms = (time.perf_counter() - start) * 1000
        self.stats.batches += 1
        self.stats.batch_sizes[len(batch)] += 1
        finite = np.isfinite(actions).reshape(len(batch), -1).all(axis=1)  # [B]
        for i, p in enumerate(batch):
            if p.future.done():  # timed out, or the client left while this batch decoded
                self.stats.dropped += 1
                continue
            if not finite[i]:  # never sent for execution, valid or not: the robot would act on NaN
                self.stats.nonfinite += 1
                logger.warning("the policy produced a chunk holding NaN or inf; answered with an error")
                p.future.set_exception(
                    RequestError(
                        f"the policy produced {int((~np.isfinite(actions[i])).sum())} NaN or inf values in this chunk; "
                        "none was sent: check the policy's saved normaliser statistics, or serve another checkpoint"
                    )
                )
                continue
            queue_ms = (start - p.queued_at) * 1000
            p.future.set_result(Result(actions[i], bool(valid[i]), int(tokens[i]), infer_ms, queue_ms, len(batch)))

    async def _worker(self) -> None:
        queue = self._queue
        window = self.config.batch_window_ms / 1000
        while True:
            batch = [await queue.get()]
            if window > 0 and queue.empty() and len(batch) < self.config.max_batch:
                await asyncio.sleep(window)  # others sent in the same instant join this batch
            while len(batch) < self.config.max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            live = [p for p in batch if not p.future.done()]
            self.stats.dropped += len(batch) - len(live)
            groups: dict[tuple, list[Pending]] = {}
            for p in live:
                groups.setdefault(p.item.group, []).append(p)
            for group in groups.values():
                try:
                    await self._run_batch(group)
                except Exception:  # noqa: BLE001 - a bug here must not stop the worker (every later request would wait)
                    logger.exception("batch failed")
                    for p in group:
                        if not p.future.done():
                            p.future.set_exception(RequestError("internal server error (logged on the server)"))

    # --- connections ---------------------------------------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request):
        if request.path.split("?")[0] == "/healthz":
            return connection.respond(200, "OK\n")
        key = self.config.api_key
        if key is not None:
            sent = request.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Api-Key {key}".encode()):
                logger.info("refused a connection from %s: no or wrong API key", connection.remote_address)
                return connection.respond(401, "a valid 'Authorization: Api-Key <key>' header is required\n")
        if request.path.split("?")[0] == "/stats":
            return connection.respond(200, json.dumps(self.stats.as_dict()) + "\n")
        refusal = self._refusal(_address(connection))
        if refusal is not None:
            self.stats.refused += 1
            logger.info("refused a connection from %s: %s", connection.remote_address, refusal)
            return connection.respond(503, refusal + "\n")
        return None

    def _refusal(self, address: str, joining: int = 0) -> str | None:
        """Why a connection from ``address`` cannot have a slot now (``joining``: it is counted already), or None."""
        c = self.config
        if self.stats.connections - joining >= c.max_clients:
            return (
                f"the server holds its limit of {c.max_clients} clients (max_clients; silent ones are closed after "
                f"{c.idle_timeout_s:g} s); retry later"
            )
        if self._per_ip[address] - joining >= c.per_ip:
            return (
                f"{address} holds its share of {c.per_ip} of the {c.max_clients} client slots (max_clients_per_ip); "
                "close one of its connections, or raise --max-clients-per-ip where robots share an address "
                "(NAT, proxy)"
            )
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        address = _address(ws)
        self.stats.connections += 1
        self._per_ip[address] += 1
        prev_total_ms = None
        history = ConnectionHistory(self.obs_steps, self.config.history_reset_s)
        try:
            refusal = self._refusal(address, joining=1)  # handshakes that passed the check together
            if refusal is not None:
                self.stats.refused += 1
                await ws.close(1013, refusal[:120])  # "try again later"
                return
            self.stats.connections_total += 1
            await ws.send(packb(self.metadata))
            while True:
                try:  # cancelling recv() loses nothing (websockets' guarantee)
                    message = await asyncio.wait_for(ws.recv(), self.config.idle_timeout_s)
                except TimeoutError:
                    self.stats.idle_closed += 1
                    await ws.close(1008, f"idle for {self.config.idle_timeout_s:g} s (idle_timeout_s); reconnect")
                    return
                start = time.perf_counter()
                try:
                    result, item = await self._serve_one(message, history)
                except RequestError as err:
                    self.stats.errors += 1
                    await ws.send(f"error: {err}")  # a text frame: openpi's client raises RuntimeError with it
                    continue
                total_ms = (time.perf_counter() - start) * 1000
                reply = {
                    "actions": result.actions,
                    "valid": result.valid,
                    "tokens": result.tokens,
                    "server_timing": {
                        "infer_ms": result.infer_ms,
                        "queue_ms": result.queue_ms,
                        "batch_size": result.batch_size,
                        "total_ms": total_ms,
                    },
                }
                if prev_total_ms is not None:
                    reply["server_timing"]["prev_total_ms"] = prev_total_ms
                if item.request_id is not None:
                    reply["request_id"] = item.request_id
                if item.history_frames is not None:
                    reply["history_frames"] = item.history_frames
                await ws.send(packb(reply))
                self.stats.requests += 1
                prev_total_ms = total_ms
        except ConnectionClosed:
            pass
        finally:
            self.stats.connections -= 1
            self._per_ip[address] -= 1
            if self._per_ip[address] <= 0:
                del self._per_ip[address]

    async def _serve_one(self, message, history: ConnectionHistory) -> tuple[Result, Item]:
        if isinstance(message, str):
            shown = repr(message[:40]) + ("..." if len(message) > 40 else "")
            raise RequestError(
                f"received a text frame ({len(message)} characters: {shown}); send observations as "
                "binary msgpack frames (openpi_client.msgpack_numpy.packb or "
                "vla.serve.packb)"
            )
        try:  # in a reader thread: a large message or camera image does not hold the other connections up
            item = await asyncio.get_running_loop().run_in_executor(self._readers, self._read, message, history)
        except DecodeError as err:
            raise RequestError(str(err)) from None
        except RequestError:
            raise
        except Exception as err:  # noqa: BLE001 - an observation no check foresaw: said to its sender, not a dropped link
            logger.warning("an observation could not be read: %r", err)
            raise RequestError(
                f"the observation could not be read ({type(err).__name__}: {err}); check it against the metadata's "
                "'observation' entry"
            ) from None
        future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(Pending(item, future, time.perf_counter()))
        except asyncio.QueueFull:
            self.stats.busy += 1
            raise RequestError(f"server busy: {self.config.max_queue} requests already queued; retry shortly") from None
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.config.request_timeout_s), item
        except TimeoutError:
            future.cancel()  # the worker skips it, or drops its result
            self.stats.timeouts += 1
            raise RequestError(f"no result within {self.config.request_timeout_s} s (request timeout)") from None

    def _read(self, message: bytes, history: ConnectionHistory) -> Item:
        """One message -> its checked ``Item`` (the connection's state history applied); runs in a reader thread."""
        return history(self.reader(unpackb(message)))

    # --- running -------------------------------------------------------------------------------------------
    async def serve(self, started: threading.Event | None = None, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (forever without one)."""
        self._queue = asyncio.Queue(maxsize=self.config.max_queue)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vla-serve-infer")
        self._readers = concurrent.futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="vla-serve-read")
        worker = asyncio.create_task(self._worker())
        c = self.config
        async with serve(
            self._handler,
            c.host,
            c.port,
            process_request=self._process_request,
            compression=None,
            max_size=c.max_message_bytes,
            max_queue=4,
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            logger.info("serving on ws://%s:%d (healthz: http://%s:%d/healthz)", c.host, self.port, c.host, self.port)
            if started is not None:
                started.set()
            try:
                await (stop.wait() if stop is not None else asyncio.Future())
            finally:
                worker.cancel()
                self._pool.shutdown(wait=False)
                self._readers.shutdown(wait=False)

    def run(self) -> None:
        """Serve forever in this thread (Ctrl-C stops it)."""
        try:
            asyncio.run(self.serve())
        except KeyboardInterrupt:
            pass

    def start_in_thread(self) -> ServerHandle:
        """Serve from a daemon thread; returns once listening. ``handle.stop()`` shuts it down."""
        return ServerHandle(self)


def _decodes_after_committed(policy) -> bool:
    """Whether ``policy`` can begin a chunk with the actions a request says will run meanwhile
    (``VLAPolicy.commit_scheme``: read beside the state by a policy trained to, forced for time-local ids, a search
    otherwise, unless the policy refuses them)."""
    return getattr(policy, "commit_scheme", None) is not None


def _address(connection: ServerConnection) -> str:
    """The remote host of a connection (the proxy's or the NAT's, for robots behind one)."""
    remote = connection.remote_address
    return str(remote[0]) if isinstance(remote, tuple) and remote else str(remote)


class ServerHandle:
    """A server running in a background thread (tests, benchmarks, a robot process hosting its own policy)."""

    def __init__(self, server: PolicyServer):
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        started = threading.Event()
        self._error: BaseException | None = None

        def main() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(server.serve(started, self._stop))
            except BaseException as err:  # noqa: BLE001 - reported to the thread that started us
                self._error = err
                started.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=main, name="vla-serve", daemon=True)
        self._thread.start()
        started.wait(timeout=30)
        if self._error is not None:
            raise self._error
        self.port: int = server.port
        self.host: str = server.config.host

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
