"""How predicted chunks become executed actions: a queue (run the first ``n`` actions of each chunk, then ask
again) or temporal ensembling (ask every ``n`` steps and run, at each step, a weighted mean of every chunk that
covers it).

Temporal ensembling is ACT's recipe (Zhao et al., 2023, "Learning Fine-Grained Bimanual Manipulation with
Low-Cost Hardware"): the weight of the i-th oldest prediction for the current step is ``exp(-coeff * i)``, so a
positive ``coeff`` trusts older predictions more and ``coeff = 0`` averages them evenly. It smooths the switch
from one chunk to the next, which an open-loop chunk policy otherwise makes as a jump.

``DelayedQueue`` is the queue for a policy whose reply takes ``delay`` control steps to arrive (a network round trip
plus the decode), while the robot keeps stepping: the request is sent when the chunk runs out and the robot holds
until the reply (``ahead=False``, synchronous), or ``delay`` actions before it runs out, so that the reply lands as the
chunk ends and its first ``delay`` actions, meant for the steps that ran meanwhile, are skipped (``ahead=True``).
Those steps' actions are known when the request leaves (``DelayedQueue.committed``): sent with it (``COMMITTED``), a
policy with time-local ids decodes the new chunk after them (committed-prefix decoding), so that it continues from
where the robot will be rather than from where it was asked.

The queue and the ensemble work on one chunk ``[T, D]`` (the rollout loop, one per episode) or a batch ``[B, T, D]``
(``VLAPolicy.select_action``), numpy or torch: actions are read as ``chunk[..., t, :]``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

# The observation's key for the actions that will run before the chunk asked for now arrives (raw [d, D]): with it the
# policy decodes the chunk knowing them (committed-prefix decoding, ``VLAPolicy``'s ``CommitActions`` step).
COMMITTED = "committed_actions"


def check_coefficient(coeff: float) -> None:
    """A temporal-ensemble coefficient: a finite number >= 0."""
    if not (math.isfinite(coeff) and coeff >= 0):
        raise ValueError(f"the temporal-ensemble coefficient must be a finite number >= 0 (ACT uses 0.01), got {coeff}")


def blend(entries: list[list], coeff: float) -> Any:
    """ACT's temporal ensemble of ``entries`` (``[chunk, index of its current step]``, oldest first, each with an
    action left): the weighted mean of their current actions, weights ``exp(-coeff * i)``; every index one step on."""
    total, norm = None, 0.0
    for i, entry in enumerate(entries):
        w = math.exp(-coeff * i)
        term = entry[0][..., entry[1], :] * w
        total, norm = term if total is None else total + term, norm + w
        entry[1] += 1
    return total / norm


class ChunkQueue:
    """Runs the first ``n_action_steps`` actions of each chunk (all of them when None), then wants a new one."""

    def __init__(self, n_action_steps: int | None = None) -> None:
        if n_action_steps is not None and n_action_steps < 1:
            raise ValueError(f"n_action_steps must be at least 1 (or None for whole chunks), got {n_action_steps}")
        self.n_action_steps = n_action_steps
        self.reset()

    def reset(self) -> None:
        self._chunk: Any = None
        self._next = 0
        self._stop = 0
        self.switched = False  # the last pop ran a chunk's first action

    def needs_chunk(self) -> bool:
        return self._next >= self._stop

    def add(self, chunk: Any) -> None:
        """A chunk ``[..., T, D]`` predicted at the current step."""
        self._chunk, self._next = chunk, 0
        self._stop = min(chunk.shape[-2], self.n_action_steps or chunk.shape[-2])

    def pop(self) -> Any:
        """The current step's action ``[..., D]``; then one step on."""
        if self.needs_chunk():
            raise RuntimeError("no action left: add a chunk first (needs_chunk() says when)")
        action = self._chunk[..., self._next, :]
        self.switched = self._next == 0
        self._next += 1
        return action


class TemporalEnsemble:
    """Asks for a chunk every ``every`` steps; each step runs the weighted mean of the actions that every chunk
    still covering it predicted for it (oldest first, weights ``exp(-coeff * i)``)."""

    def __init__(self, coeff: float, every: int = 1) -> None:
        check_coefficient(coeff)
        if every < 1:
            raise ValueError(f"a temporal ensemble asks for a chunk every n >= 1 steps, got {every}")
        self.coeff, self.every = float(coeff), int(every)
        self.reset()

    def reset(self) -> None:
        self._chunks: list[list[Any]] = []  # [chunk, index of the current step in it], oldest first
        self._since = None  # steps since the last chunk; None before the first

    def needs_chunk(self) -> bool:
        return self._since is None or self._since >= self.every or not self._chunks

    def add(self, chunk: Any) -> None:
        self._chunks.append([chunk, 0])
        self._since = 0

    def pop(self) -> Any:
        if not self._chunks:
            raise RuntimeError("no action left: add a chunk first (needs_chunk() says when)")
        total = blend(self._chunks, self.coeff)
        self._chunks = [entry for entry in self._chunks if entry[1] < entry[0].shape[-2]]
        self._since += 1
        return total


class DelayedQueue:
    """A chunk queue whose replies arrive ``delay_steps`` control steps after the request (``vla eval --delay-ms``).

    Each step the rollout asks ``needs_chunk()``; when it says yes, it predicts a chunk from this step's observation and
    ``add``s it: the chunk is delivered ``delay_steps`` later (at once for the episode's first chunk: the robot starts
    when its first chunk is there). ``pop()`` gives the step's action, or None when the robot has nothing to run and
    holds (the simulator says what holding is: ``hold_action``).

    * ``ahead=False`` (synchronous, today's robot client): ask when the chunk's ``n_action_steps`` have run; hold
      until the reply; run it from its first action (the robot did not move meanwhile).
    * ``ahead=True``: ask when ``delay_steps`` of them remain; meanwhile the current chunk runs on (beyond
      ``n_action_steps`` when the reply is late, then the robot holds); the reply's first actions are for the actions
      that ran while it was on its way (``committed``), and as many are skipped: ``delay_steps``, or fewer when the
      running chunk ran out first and the robot held (it paused; the reply goes on from where it stopped).
    * ``every=k`` (with ``ahead``): ask every ``k`` steps whatever is on its way, so that several replies are in
      flight when ``k < delay_steps``; each one replaces the running chunk when it lands, its first actions skipped as
      above. A chunk then needs ``delay_steps + k`` actions, not twice the delay, and each action runs at most
      ``delay_steps + k`` steps after the observation it was predicted from. ``n_action_steps`` plays no part.

    * ``ensemble=c`` (with ``every``): a reply that lands joins the chunks still running rather than replacing them,
      and each step runs the weighted mean of what every running chunk planned for it (``TemporalEnsemble``'s weights,
      oldest first: ACT's temporal ensembling across the delay), so the hand-over is a blend rather than a jump; the
      robot holds only when every chunk has run out.

    With ``delay_steps = 0`` the first two are exactly ``ChunkQueue``. ``switched`` says whether the last ``pop`` ran
    the first action of a new chunk (for the jump at the hand-over).
    """

    def __init__(
        self,
        n_action_steps: int | None,
        delay_steps: int,
        ahead: bool = False,
        every: int | None = None,
        ensemble: float | None = None,
    ):
        if n_action_steps is not None and n_action_steps < 1:
            raise ValueError(f"n_action_steps must be at least 1 (or None for whole chunks), got {n_action_steps}")
        if delay_steps < 0:
            raise ValueError(f"a delay is a number of control steps >= 0, got {delay_steps}")
        if every is not None and (every < 1 or not ahead):
            raise ValueError(
                f"every = {every}: a request every k >= 1 steps, with several on their way, is a way of asking "
                "ahead; pass ahead=True and k >= 1 (or every=None)"
            )
        if ensemble is not None and every is None:
            raise ValueError(
                f"ensemble = {ensemble} behind a delay blends the replies on their way: it needs requests every k "
                "steps (every=k with ahead=True; --ahead --every K|decode)"
            )
        if ensemble is not None:
            check_coefficient(ensemble)
        self.n_action_steps, self.delay_steps, self.ahead = n_action_steps, int(delay_steps), bool(ahead)
        self.every, self.ensemble = every, ensemble
        self.reset()

    def reset(self) -> None:
        self._chunk: Any = None  # the chunk running now, its skipped actions already cut off
        self._next = 0  # index of its next action
        self._stop = 0  # its planned actions end here (n_action_steps); later ones run only while a reply is late
        self._replies: list[list] = []  # [chunk, steps until it lands, actions run when it was asked], oldest first
        self._ran = 0  # actions run this episode
        self._since = 0  # steps since the last request
        self._new = False  # the running chunk's first action has not run yet
        self._blend: list[list] = []  # with ensemble: [chunk, index of its next action], oldest first
        self.switched = False

    def _deliver(self) -> None:
        while self._replies and self._replies[0][1] <= 0:
            chunk, _, ran = self._replies.pop(0)
            skip = self._ran - ran if self.ahead else 0  # the actions that ran while it was on its way
            if self.ensemble is not None:
                if chunk.shape[-2] > skip:  # a reply whose every action is stale adds nothing to the blend
                    self._blend.append([chunk[..., skip:, :], 0])
                    self._chunk, self._new = self._blend[-1][0], True  # the newest; needs_chunk's first request
                continue
            self._chunk, self._next, self._new = chunk[..., skip:, :], 0, True
            size = self._chunk.shape[-2]
            self._stop = size if self.every else min(size, self.n_action_steps or size)

    def needs_chunk(self) -> bool:
        self._deliver()
        if self._chunk is None:
            return not self._replies
        if self.every:
            return self._since >= self.every or (not self._replies and self._actions_left() == 0)
        if self._replies:
            return False
        return self._stop - self._next <= (self.delay_steps if self.ahead else 0)

    def _actions_left(self) -> int:
        """How many more steps the running chunk (with ensemble: the longest-running of the blend) has actions for."""
        if self.ensemble is not None:
            return max((chunk.shape[-2] - t for chunk, t in self._blend), default=0)
        return self._chunk.shape[-2] - self._next

    def _blended(self) -> Any:
        """The weighted mean of every running chunk's action for this step (oldest first, ``exp(-ensemble * i)``), one
        step on in each; None when all have run out."""
        self._blend = [entry for entry in self._blend if entry[1] < entry[0].shape[-2]]
        return blend(self._blend, self.ensemble) if self._blend else None

    def committed(self) -> Any:
        """The actions that will run while a reply asked for now is on its way, as far as they are known: with
        ``ahead``, the running chunk's next ``delay_steps`` (fewer when it ends first: the robot then holds, or when a
        reply already on its way lands first: its actions are not known yet), ``[d, D]``; none otherwise (the robot
        holds), and none before the first chunk or when replies are blended."""
        if not self.ahead or self._chunk is None or self.ensemble is not None:  # blended: not one chunk's actions
            return None
        known = min([self.delay_steps] + [wait for _, wait, _ in self._replies])
        return self._chunk[..., self._next : self._next + known, :]

    def add(self, chunk: Any) -> None:
        """A chunk predicted from the current step's observation; it arrives ``delay_steps`` steps from now."""
        first = self._chunk is None and not self._replies
        self._replies.append([chunk, 0 if first else self.delay_steps, self._ran])
        self._since = 0
        self._deliver()

    def pop(self) -> Any:
        """The current step's action ``[..., D]``, or None when the robot holds; then one step on."""
        self._deliver()
        action, self.switched = None, False
        running_on = self.ahead and self._replies  # a late reply: the rest of the chunk runs meanwhile
        if self.ensemble is not None and self._chunk is not None:
            action = self._blended()
            if action is not None:
                self.switched, self._new = self._new, False
                self._ran += 1
        elif (
            self.ensemble is None
            and self._chunk is not None
            and (self._next < self._stop or (running_on and self._next < self._chunk.shape[-2]))
        ):
            action = self._chunk[..., self._next, :]
            self.switched, self._new = self._new, False
            self._next += 1
            self._ran += 1
        elif self._chunk is None and not self._replies:
            raise RuntimeError("no action left: add a chunk first (needs_chunk() says when)")
        for reply in self._replies:
            reply[1] -= 1
        self._since += 1
        return action


class StateHistory:
    """The last ``n`` states of an episode, oldest first; the first one repeated until there are n (as LeRobot pads
    ``n_obs_steps``). One per episode: the rollout loop keeps one per env, ``VLAPolicy.select_action`` one per batch."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a state history holds n >= 1 frames, got {n}")
        self.frames: deque = deque(maxlen=n)

    def push(self, state: Any) -> list[Any]:
        """Add this step's state; the n frames to show the policy, oldest first (stack them on the frame axis)."""
        if not self.frames:
            self.frames.extend([state] * (self.frames.maxlen - 1))
        self.frames.append(state)
        return list(self.frames)


def executor(
    n_action_steps: int | None,
    ensemble: float | None,
    delay_steps: int = 0,
    ahead: bool = False,
    every: int | None = None,
) -> ChunkQueue | TemporalEnsemble | DelayedQueue:
    """A ``DelayedQueue`` when replies take ``delay_steps`` > 0 or are asked ``ahead`` (every ``every`` steps when
    given; an ``ensemble`` then blends the replies that overlap); else the queue for ``ensemble=None``, or a temporal
    ensemble asking every ``n_action_steps`` (default 1)."""
    if ensemble is not None and (delay_steps or ahead) and every is None:
        raise ValueError(
            "a temporal ensemble behind a reply delay blends the replies on their way: ask ahead every K steps "
            "(--ahead --every K or --every decode), or drop --temporal-ensemble"
        )
    if delay_steps or ahead:
        return DelayedQueue(n_action_steps, delay_steps, ahead, every, ensemble)
    if ensemble is None:
        return ChunkQueue(n_action_steps)
    return TemporalEnsemble(ensemble, every=n_action_steps or 1)


__all__ = ["ChunkQueue", "DelayedQueue", "StateHistory", "TemporalEnsemble", "blend", "check_coefficient", "executor"]
