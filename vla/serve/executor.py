"""The robot side's action-chunk executor, at the control rate, on a ``PolicyClient`` (``vla.serve.client``).

``ChunkExecutor`` keeps the robot acting while the next chunk decodes. Each ``act(obs)`` (one control tick) returns
the next action of the current chunk; when ``k`` actions are left it sends ``obs`` in a background thread, remembering
how many actions had run. When that chunk arrives, its first ``d`` actions were meant for the ``d`` actions that ran
meanwhile: they are dropped (counted as ``stale``) and the chunk is executed from action ``d``, replacing what was
left of the old one (ticks the robot held do not count: it paused, and the chunk goes on from where it stopped). If a chunk is late (the current one is used up and nothing new has come), the last action is
held and counted (``held``): never zeros, which would mean "go to the zero pose" to an absolute-position robot.
For a policy that reads a state history (``n_obs_steps`` = n > 1, from the server's metadata), the executor keeps
the last n states of the episode at the control rate (``vla.execution.StateHistory``, every tick, so the frames are
as far apart as in training) and sends them as ``[n, S]``, oldest first, with each request.
With ``commit`` (the default when the server's policy decodes after them: ``metadata["policy"]["committed_actions"]``)
an overlapped request carries the actions the robot will run while it is on its way (``committed_actions``: what is
left of the current chunk), and the chunk that comes back is decoded knowing them (committed-prefix decoding: forced,
searched for or conditioned, the policy's ``commit_scheme``).
With ``every=K`` (overlapped) a request leaves every K ticks whether or not the last one has landed, several on their
way, each on a connection of its own (``infer`` a list of clients: openpi's protocol answers one request at a time per
connection); each reply replaces the running chunk when it lands, unless a later request's reply landed first, so a
chunk need cover only the round trip plus K ticks (``vla eval --every``'s simulated twin). With ``ensemble=c`` as
well, a reply that lands joins the chunks still running instead of replacing them, and each tick runs the weighted
mean of their actions for it (ACT's temporal ensembling, weights ``exp(-c * i)`` oldest first; ``vla eval --every K
--temporal-ensemble c``'s twin).
``mode="sync"`` is the baseline (openpi's ``ActionChunkBroker`` in a real-time world): ask only when the chunk is used
up, hold the last action while waiting, execute the new chunk from its start. A failed request (server down) counts
as an error, the last action is held, and the request is sent again on the next tick.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vla.execution import (  # plain Python: the robot side still needs no torch
    COMMITTED,
    StateHistory,
    blend,
    check_coefficient,
)
from vla.serve.client import STATE_KEYS, PolicyClient

logger = logging.getLogger(__name__)
# An episode's first chunk: after a failed request, wait this long before asking again, doubling up to the most.
FIRST_RETRY_S, FIRST_RETRY_MAX_S = 0.05, 1.0


class Rate:
    """Sleep to the next tick of a fixed-rate loop; ticks that overran are counted (``overruns``), not made up."""

    def __init__(self, hz: float):
        self.period = 1.0 / hz
        self.next = time.perf_counter() + self.period
        self.overruns = 0

    def reset(self) -> None:
        self.next = time.perf_counter() + self.period

    def sleep(self) -> None:
        now = time.perf_counter()
        if now < self.next:
            time.sleep(self.next - now)
            self.next += self.period
        else:
            self.overruns += 1
            self.next = now + self.period


@dataclass
class ExecutorStats:
    ticks: int = 0  # act() calls
    executed: int = 0  # actions taken from a chunk
    held: int = 0  # ticks that repeated the last action because no fresh one was ready (a late chunk)
    stale: int = 0  # actions dropped because the round trip made them stale
    wasted_chunks: int = 0  # chunks that arrived with every action stale
    requests: int = 0
    chunks: int = 0  # chunks adopted
    errors: int = 0  # failed requests (server down, error reply, timeout)
    first_wait_ms: list[float] = field(default_factory=list)  # waits for each episode's first chunk
    round_trip_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        rtt = self.round_trip_ms
        d = {k: v for k, v in self.__dict__.items() if k not in ("round_trip_ms", "first_wait_ms")}
        d["round_trip_ms_p50"] = float(np.percentile(rtt, 50)) if rtt else math.nan
        d["round_trip_ms_p95"] = float(np.percentile(rtt, 95)) if rtt else math.nan
        d["held_fraction"] = self.held / self.ticks if self.ticks else 0.0
        return d


class ChunkExecutor:
    """Executes action chunks at the control rate, asking for the next while ``k`` actions are left.

    ``infer``: a ``PolicyClient`` (or any ``obs -> {"actions": [T, D], ...}`` callable / object with ``infer``), or a
    list of them: as many requests on their way at once (``every``), each on its own.
    ``control_hz``: the robot's control rate (ticks per second), used to turn round trips into ticks for ``k=None``.
    ``k``: ask for the next chunk when this many actions are left (``None``: the measured round trip in ticks, plus
    one, from a running median; half the chunk before the first measurement). ``horizon``: the most actions used from
    one chunk (default: all of it; sync mode with the policy's ``n_action_steps`` is ``vla eval``'s schedule).
    ``mode``: ``"overlapped"`` or ``"sync"`` (see the module docstring). ``n_obs_steps``: how many states the policy
    reads (``None``: the server's metadata, ``metadata["policy"]["n_obs_steps"]``, when ``infer`` has one, else 1);
    above 1 each request carries the episode's last n states ``[n, S]`` (see the module docstring), read from
    ``state_key`` (default: the first of ``STATE_KEYS`` the observation holds; name yours if ``vla serve --key``
    renames it). ``commit``: send the committed actions with each overlapped request (``None``: when the server's
    metadata says its policy decodes after them). ``every``: with ``mode="overlapped"``, ask every ``every`` ticks,
    several requests on their way (one per client of ``infer``; a tick with none free asks on the next), instead of
    when ``k`` actions are left. ``ensemble``: with ``every``, blend each reply with the chunks still running (ACT's
    temporal-ensemble coefficient, 0.01 in ACT) instead of replacing them.
    """

    def __init__(
        self,
        infer: Callable[[dict], dict] | PolicyClient,
        *,
        control_hz: float,
        k: int | None = None,
        horizon: int | None = None,
        mode: str = "overlapped",
        first_chunk_timeout_s: float = 30.0,
        n_obs_steps: int | None = None,
        state_key: str | None = None,
        commit: bool | None = None,
        every: int | None = None,
        ensemble: float | None = None,
    ):
        if ensemble is not None and every is None:
            raise ValueError(
                f"ensemble = {ensemble}: a temporal ensemble blends the replies on their way, so it needs every=K "
                "(requests every K ticks)"
            )
        if ensemble is not None:
            check_coefficient(ensemble)
        if mode not in ("overlapped", "sync"):
            raise ValueError(f"mode must be 'overlapped' or 'sync', got {mode!r}")
        if k is not None and k < 0:
            raise ValueError(f"k must be >= 0 (or None for automatic), got {k}")
        clients = list(infer) if isinstance(infer, (list, tuple)) else [infer]
        if not clients or (every is not None and (every < 1 or mode != "overlapped")):
            raise ValueError(
                f"every = {every} with mode {mode!r} and {len(clients)} clients: asking every K >= 1 ticks is an "
                "overlapped mode, with at least one client (one per request on its way)"
            )
        if commit and (mode != "overlapped" or every is not None):
            raise ValueError(
                f"commit=True with mode {mode!r} and every = {every}: the committed actions are those that run while "
                "one reply is on its way, so they exist in the overlapped mode asking one request at a time (a "
                "synchronous robot runs nothing while it waits; asked every K ticks, which actions run before a reply "
                "lands is not known when it is asked); use commit=None or False, or mode='overlapped' without every"
            )
        infer = clients[0]
        metadata = {}
        if n_obs_steps is None or commit is None:
            metadata = (infer.get_server_metadata() if hasattr(infer, "get_server_metadata") else {}) or {}
        if n_obs_steps is None:
            n_obs_steps = int(metadata.get("policy", {}).get("n_obs_steps", 1))
        if commit is None:
            commit = bool(metadata.get("policy", {}).get("committed_actions", False))
        # from the server's metadata: off where commit=True is refused above
        self.commit = bool(commit) and mode == "overlapped" and every is None
        if n_obs_steps < 1:
            raise ValueError(f"n_obs_steps must be >= 1 (the states the policy reads), got {n_obs_steps}")
        self.n_obs_steps, self.state_key = n_obs_steps, state_key
        self._connections = len(clients)
        self._free: queue.SimpleQueue = queue.SimpleQueue()  # the connections no request is using
        for client in clients:
            self._free.put(client.infer if hasattr(client, "infer") else client)
        self.control_hz = float(control_hz)
        self.k, self.horizon, self.mode, self.every, self.ensemble = k, horizon, mode, every, ensemble
        self.first_chunk_timeout_s = first_chunk_timeout_s
        self.stats = ExecutorStats()
        self._pool = concurrent.futures.ThreadPoolExecutor(len(clients), thread_name_prefix="vla-chunk-request")
        self._lock = threading.Lock()
        self._recent_rtt: deque[float] = deque(maxlen=9)
        self.executed_actions: list[np.ndarray] = []  # every action act() returned this episode
        self.reset()

    # --- per episode ---------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start an episode: forget the chunk and the last action; a reply still in flight is discarded."""
        with self._lock:
            self._epoch = getattr(self, "_epoch", 0) + 1
            # the replies landed since the last tick: (chunk, the actions run when it was asked, its request's
            # number); an older one never replaces a newer one, and with ensemble each joins the blend
            self._arrived: list[tuple[np.ndarray, int, int]] = []
            self._asked = self._adopted = 0  # requests sent, and the number of the one adopted, this episode
            self._failure: str | None = None  # why the last request failed, said if the first chunk never comes
        self._inflight: list[concurrent.futures.Future] = []
        self._since = 0  # ticks since the last request
        self._chunk: np.ndarray | None = None
        self._index = 0
        self._blend: list[
            list
        ] = []  # with ensemble: [chunk cut to its usable actions, index of its next], oldest first
        self._last: np.ndarray | None = None
        self.tick = 0
        self.executed_actions = []
        self._history = StateHistory(self.n_obs_steps) if self.n_obs_steps > 1 else None

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        """The action for this tick (float ``[D]``). Blocks only for an episode's first chunk."""
        if self._history is not None:
            obs = self._with_history(obs)
        self._adopt()
        if self._last is None and self._chunk is None:  # episode start: nothing to hold, wait for the first chunk
            start = time.perf_counter()
            deadline = start + self.first_chunk_timeout_s
            failed = 0  # requests in a row that came back without a chunk
            while self._chunk is None and time.perf_counter() < deadline:
                if not self._inflight:
                    if failed:  # a server that refuses every request is not asked thousands of times a second
                        pause = min(FIRST_RETRY_S * 2 ** (failed - 1), FIRST_RETRY_MAX_S)
                        time.sleep(min(pause, max(deadline - time.perf_counter(), 0)))
                    self._request(obs)
                wait = max(deadline - time.perf_counter(), 0)
                concurrent.futures.wait(self._inflight, timeout=wait, return_when=concurrent.futures.FIRST_COMPLETED)
                self._adopt(fresh_start=True)
                failed += self._chunk is None and not self._inflight
            self.stats.first_wait_ms.append((time.perf_counter() - start) * 1000)
            if self._chunk is None:
                with self._lock:
                    why = f"the last request failed: {self._failure}" if self._failure else "is the server up?"
                raise TimeoutError(f"no first chunk within {self.first_chunk_timeout_s} s ({why})")
        left = self._left()
        if self._asks(left):
            if self.commit and left > 0:  # this tick's action and the rest run while the reply is on its way
                obs = {**obs, COMMITTED: np.array(self._chunk[self._index : self._index + left], dtype=np.float32)}
            self._request(obs)
        if left > 0:
            action = self._blended() if self.ensemble is not None else self._chunk[self._index]
            self._index += 1
            self.stats.executed += 1
        else:
            action = self._last
            self.stats.held += 1
        self._last = action
        self._since += 1
        self.tick += 1
        self.stats.ticks += 1
        self.executed_actions.append(action)
        return np.array(action, copy=True)

    # --- internals -----------------------------------------------------------------------------------------
    def _with_history(self, obs: dict[str, Any]) -> dict[str, Any]:
        """``obs`` with its state ``[S]`` replaced by the episode's last n states ``[n, S]`` (pushed every tick)."""
        keys = (self.state_key,) if self.state_key else STATE_KEYS
        key = next((k for k in keys if k in obs), None)
        if key is None:
            raise ValueError(
                f"the policy reads the last {self.n_obs_steps} states, but the observation has none of "
                f"{', '.join(keys)}: send the robot state every tick (or name its key: "
                "state_key=)"
            )
        state = np.array(obs[key], dtype=np.float32).reshape(-1)  # a copy: robots reuse their buffers
        frames = self._history.frames
        if frames and frames[-1].shape != state.shape:
            raise ValueError(
                f"the state changed size within an episode ({len(frames[-1])} -> {len(state)}); call "
                "executor.reset() when a new episode starts"
            )
        return {**obs, key: np.stack(self._history.push(state))}

    def _asks(self, left: int) -> bool:
        """Whether this tick sends a request: every ``every`` ticks with a connection free, else when ``k`` actions
        are left (none in sync mode) and nothing is on its way."""
        if self.every is not None:
            return self._since >= self.every and len(self._inflight) < self._connections
        return not self._inflight and left <= (0 if self.mode == "sync" else self._k())

    def _k(self) -> int:
        size = self._usable()
        if self.k is not None:
            return min(self.k, max(size - 1, 0))
        if not self._recent_rtt:
            return size // 2
        ticks = math.ceil(float(np.median(self._recent_rtt)) * self.control_hz / 1000) + 1
        return int(min(max(ticks, 1), max(size - 1, 0)))

    def _usable(self) -> int:
        if self._chunk is None:
            return 0
        return len(self._chunk) if self.horizon is None else min(self.horizon, len(self._chunk))

    def _left(self) -> int:
        if self.ensemble is not None:
            return max((len(chunk) - i for chunk, i in self._blend), default=0)
        return max(self._usable() - self._index, 0)

    def _blended(self) -> np.ndarray:
        """The weighted mean of every running chunk's action for this tick (oldest first, ``exp(-ensemble * i)``),
        one action on in each."""
        self._blend = [entry for entry in self._blend if entry[1] < len(entry[0])]
        return blend(self._blend, self.ensemble)

    def _request(self, obs: dict[str, Any]) -> None:
        self.stats.requests += 1
        self._since = 0
        with self._lock:
            self._asked += 1
            number = self._asked
        # the reply's first actions are for those the robot runs from now on: as many as ran are dropped on arrival
        self._inflight.append(self._pool.submit(self._fetch, obs, self.stats.executed, self._epoch, number))

    def _fetch(self, obs: dict[str, Any], ran: int, epoch: int, number: int) -> None:
        start = time.perf_counter()
        infer = self._free.get()
        try:
            reply = infer(obs)
            chunk = np.asarray(reply["actions"], dtype=np.float64)
            if chunk.ndim != 2 or len(chunk) == 0 or not np.isfinite(chunk).all():
                raise ValueError(f"the server sent actions of shape {list(chunk.shape)} (or non-finite values)")
        except Exception as err:  # noqa: BLE001 - counted; the robot holds its last action and asks again
            self.stats.errors += 1
            logger.warning("chunk request failed: %s", err)
            with self._lock:
                if epoch == self._epoch:
                    self._failure = str(err) or type(err).__name__
            return
        finally:
            self._free.put(infer)
        rtt_ms = (time.perf_counter() - start) * 1000
        with self._lock:
            if epoch != self._epoch:  # a reply for an episode that has ended
                return
            self._arrived.append((chunk, ran, number))
            self._recent_rtt.append(rtt_ms)
            self.stats.round_trip_ms.append(rtt_ms)

    def _adopt(self, fresh_start: bool = False) -> None:
        """Switch to a chunk that has arrived, dropping its first actions, meant for those that ran while it was on its
        way (not for ticks the robot held: it paused, and the chunk goes on from where it stopped). Of several landed
        since the last tick, the newest; with ``ensemble`` every one joins the blend, in the order they were asked."""
        self._inflight = [f for f in self._inflight if not f.done()]
        with self._lock:
            arrived, self._arrived = sorted(self._arrived, key=lambda a: a[2]), []
        if self.ensemble is None:
            arrived = arrived[-1:]
        for chunk, ran, number in arrived:
            if number < self._adopted:  # older than the chunk running (or, blended, the newest in the blend)
                continue
            self._adopted = number
            late = 0 if (fresh_start or self.mode == "sync") else self.stats.executed - ran
            usable = len(chunk) if self.horizon is None else min(self.horizon, len(chunk))
            if late >= usable:
                self.stats.wasted_chunks += 1
                self.stats.stale += usable
                continue
            self._chunk, self._index = chunk, late
            if self.ensemble is not None:
                self._blend.append([chunk[:usable], late])
            self.stats.stale += late
            self.stats.chunks += 1

    def close(self) -> None:
        """Stop the request thread (after the request in flight, if any, has its answer or its timeout)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def action_jerk(actions: np.ndarray, control_hz: float | None = None) -> float:
    """RMS of the second difference of an executed action sequence ``[N, D]``.

    For velocity-like actions (Meta-World's hand displacement per step) this is the commanded jerk up to a constant;
    chunk boundaries that jump, and held actions that stop short, both raise it. Per step squared (``control_hz``
    scales it to per second squared).
    """
    a = np.asarray(actions, dtype=np.float64)
    if len(a) < 3:
        return 0.0
    d2 = np.diff(a, n=2, axis=0)
    value = float(np.sqrt(np.mean(np.sum(d2**2, axis=-1))))
    return value * control_hz**2 if control_hz else value
