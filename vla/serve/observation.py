"""What a robot sends, checked and converted before it reaches the policy: one decoded message -> an ``Item``
(state, cameras resized on the server, the instruction), or a ``RequestError`` saying what is wrong (the server
answers it and keeps the connection open); and, for a policy that reads a state history (``n_obs_steps`` = n > 1),
the history a connection's messages make (``ConnectionHistory``) when the robot sends one state at a time."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vla.execution import COMMITTED, StateHistory
from vla.policy.checks import checked_state
from vla.policy.images import camera_image

MAX_TASK_CHARS = 1000
MAX_IMAGE_SIDE = 4096


class RequestError(ValueError):
    """A request the server answers with an error reply (the connection stays open)."""


@dataclass
class Item:
    """One observation, checked and converted: what a batch is stacked from."""

    # float32 [S]; n_obs_steps = n > 1: [n, S] (the client's history, or the server's made); None: an image-only policy
    state: torch.Tensor | None
    images: dict[str, torch.Tensor]  # policy key -> float32 [3, H, W] in [0, 1]
    task: str
    request_id: Any = None
    reset: bool = False  # the message starts an episode (its "reset" key): the server's history starts again
    committed: np.ndarray | None = None  # float32 [d, D]: the actions that will run before the reply arrives
    history_frames: int | None = None  # server-kept history: how many of its n frames this episode has sent

    @property
    def group(self) -> tuple:
        """Observations with equal image shapes can share one batch."""
        return tuple((k, tuple(v.shape)) for k, v in sorted(self.images.items()))


RESET_KEY = "reset"  # a message flag: this observation is an episode's first


def numeric(value: Any, key: str, what: str) -> np.ndarray:
    """``value`` as a numeric array, or a ``RequestError`` naming ``key``, what arrived and what to send (``what``)."""
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
    elif isinstance(value, (list, tuple, int, float)):
        try:
            array = np.asarray(value)
        except ValueError:  # numpy's "inhomogeneous shape"
            raise RequestError(f"'{key}' is a ragged list (rows of different lengths); send {what}") from None
    else:
        preview = repr(value)[:40] + ("..." if len(repr(value)) > 40 else "")
        raise RequestError(f"'{key}' is a {type(value).__name__} ({preview}); send {what}")
    if array.dtype.kind not in "biuf":
        kind = {"U": "strings", "S": "bytes", "O": "mixed values (a list with None or strings in it)"}
        received = kind.get(array.dtype.kind, "values that are not numbers")
        raise RequestError(f"'{key}' holds {received} (dtype {array.dtype.str}); send {what}")
    return array.astype(np.float32, copy=False)


class ObservationReader:
    """A decoded message -> an ``Item`` for a policy with these keys and shapes; ``RequestError`` says what is wrong."""

    def __init__(
        self,
        state_dim: int,
        image_keys: list[str],
        image_size: int | None,
        keys: dict[str, str],
        obs_steps: int = 1,
        committed: tuple[int, int] | None = None,
    ):
        self.state_dim = int(state_dim)
        # (T, D) when the policy decodes a chunk after the actions that run meanwhile; None: it cannot (FAST, BEAST)
        self.committed = committed
        self.obs_steps = int(obs_steps)  # the policy's n_obs_steps: > 1 accepts [S] (one state) or [n, S]
        self.image_keys = list(image_keys)
        self.image_size = image_size
        self.renames = {k.replace("/", "."): v for k, v in keys.items()}
        self.aliases = {"state": "observation.state", "task": "prompt"}
        for key in self.image_keys:
            self.aliases[key.replace("observation.images.", "images.")] = key
        if len(self.image_keys) == 1:
            self.aliases["image"] = self.aliases["observation.image"] = self.image_keys[0]

    def state_shapes(self) -> list[list[int]]:
        """The state shapes a message may carry: ``[S]``, and with a history ``[n, S]`` too (none: image only)."""
        if not self.state_dim:
            return []
        return [[self.state_dim]] + ([[self.obs_steps, self.state_dim]] if self.obs_steps > 1 else [])

    def _state_hint(self) -> str:
        n, s = self.obs_steps, self.state_dim
        if n == 1:
            return f"float [{s}]"
        return (
            f"float [{s}] (one state a message: the server keeps the connection's last {n}; send '{RESET_KEY}': "
            f"true with an episode's first) or float [{n}, {s}] (the last {n} states, oldest first)"
        )

    def expected(self) -> dict[str, str]:
        """What the metadata tells clients to send."""
        out = {"prompt": "str (or 'task')", RESET_KEY: "bool, optional: true on an episode's first observation"}
        if self.state_dim:  # an image-only policy (state_dim 0) reads no state
            out = {"observation.state": self._state_hint(), **out}
        for key in self.image_keys:
            out[key] = "uint8 [H, W, 3] (or [3, H, W], or float in [0, 1]); resized on the server"
        if self.committed is not None:
            horizon, dim = self.committed
            out[COMMITTED] = (
                f"float [d, {dim}], optional, d <= {horizon}: the actions that will run before the reply arrives; the "
                "chunk is decoded knowing them (the policy's commit scheme: forced, searched for or conditioned)"
            )
        return out

    def __call__(self, message: Any) -> Item:
        if not isinstance(message, dict):
            raise RequestError(f"an observation is a map of keys to values, got {type(message).__name__}")
        obs: dict[str, Any] = {}
        sent: dict[str, str] = {}  # policy key -> the key the client used, for error messages
        for key, value in message.items():
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            if not isinstance(key, str):
                raise RequestError(f"observation keys must be strings, got {key!r}")
            name = self.renames.get(key.replace("/", "."), key.replace("/", "."))
            name = self.aliases.get(name, name)
            obs[name] = value
            sent.setdefault(name, key)
        request_id = obs.get("request_id")
        if request_id is not None and not isinstance(request_id, (int, str)):
            raise RequestError(f"request_id must be an int or a string, got {type(request_id).__name__}")
        reset = obs.get(RESET_KEY, False)
        if not isinstance(reset, (bool, np.bool_)):
            raise RequestError(
                f"'{RESET_KEY}' must be true or false (true on an episode's first observation), got "
                f"a {type(reset).__name__}"
            )
        state = self._state(obs, sent.get("observation.state", "observation.state"))
        images = {k: self._image(obs, k) for k in self.image_keys}
        committed = self._committed(obs[COMMITTED], sent[COMMITTED]) if COMMITTED in obs else None
        return Item(state, images, self._task(obs), request_id, reset=bool(reset), committed=committed)

    def _committed(self, value: Any, sent: str) -> np.ndarray:
        """The actions that will run while the reply is on its way, ``[d, D]`` with ``d`` <= T, finite."""
        if self.committed is None:
            raise RequestError(
                f"'{sent}' names actions the chunk should begin with, but this policy refuses them (its ids mix the "
                "chunk's steps and its commit_search is 0): drop it, or serve it with commit_search > 0"
            )
        horizon, dim = self.committed
        what = f"float [d, {dim}] with d <= {horizon}: the actions that will run before the reply arrives"
        actions = numeric(value, sent, what)
        if actions.size == 0:
            return np.zeros((0, dim), dtype=np.float32)
        if actions.ndim != 2 or actions.shape[1] != dim or len(actions) > horizon:
            raise RequestError(f"'{sent}' has shape {list(actions.shape)}; send {what}")
        if not np.isfinite(actions).all():
            raise RequestError(f"'{sent}' holds NaN or inf; send {what}")
        return actions

    def _state(self, obs: dict[str, Any], sent: str) -> torch.Tensor | None:
        n, s = self.obs_steps, self.state_dim
        if s == 0:  # an image-only policy: a state sent anyway is not read
            return None
        if "observation.state" not in obs:
            raise RequestError(
                f"the observation lacks 'observation.state' (keys sent: {', '.join(sorted(obs))}); "
                f"send the robot state as {self._state_hint()}"
            )
        state = numeric(obs["observation.state"], sent, f"the robot state as {self._state_hint()}")
        if n > 1 and state.shape in ((n, s), (1, n, s)):
            try:  # the client's history [n, S] (or [1, n, S]): the policy pipeline's own check
                return torch.from_numpy(checked_state(state.reshape(1, n, s), s, n)[0].astype(np.float32))
            except ValueError as err:
                raise RequestError(str(err)) from None
        if n > 1 and not (state.shape == (s,) or state.shape == (1, s)):
            raise RequestError(f"'{sent}' has shape {list(state.shape)}; send {self._state_hint()}")
        try:  # the policy pipeline's own check: one observation, [S] or [1, S]
            state = checked_state(state, s)
        except ValueError as err:
            raise RequestError(str(err)) from None
        if len(state) != 1:
            raise RequestError(f"'{sent}' holds {len(state)} states; send one observation per message")
        return torch.from_numpy(state[0].astype(np.float32))

    def _image(self, obs: dict[str, Any], key: str) -> torch.Tensor:
        if key not in obs:
            raise RequestError(
                f"the observation lacks camera {key!r} (keys sent: {', '.join(sorted(obs))}); "
                "send it as uint8 [H, W, 3]"
            )
        image = obs[key]
        if isinstance(image, np.ndarray) and image.ndim == 4 and image.shape[0] == 1:
            image = image[0]  # a batch of one
        if not isinstance(image, np.ndarray) or image.dtype.kind not in "uf" or image.ndim != 3:
            what = f"{image.dtype} {list(image.shape)}" if isinstance(image, np.ndarray) else type(image).__name__
            raise RequestError(f"camera {key!r} must be a uint8 [H, W, 3] array (or [3, H, W]), got {what}")
        if image.shape[-1] == 3 and image.shape[0] != 3:
            image = image.transpose(2, 0, 1)  # HWC (openpi's layout) -> CHW
        elif image.shape[0] != 3:
            raise RequestError(f"camera {key!r} has shape {list(image.shape)}; send [H, W, 3] or [3, H, W] RGB")
        if not (1 <= min(image.shape[1:]) and max(image.shape[1:]) <= MAX_IMAGE_SIDE):
            raise RequestError(f"camera {key!r} is {list(image.shape)}; sides must be 1..{MAX_IMAGE_SIDE} pixels")
        _check_pixels(image, key)
        # np.array copies (arrays read from a message are read-only views of its bytes); the policy pipeline's own
        # conversion and resize, done here so that robots with other camera sizes share one batch
        try:
            return camera_image(np.array(image), key, 1, self.image_size)[0]
        except ValueError as err:
            raise RequestError(str(err)) from None

    @staticmethod
    def _task(obs: dict[str, Any]) -> str:
        task = obs.get("prompt")
        if isinstance(task, bytes):
            task = task.decode("utf-8", "replace")
        if not isinstance(task, str) or not task.strip():
            raise RequestError("the observation lacks the instruction: send 'prompt' (or 'task') as a non-empty str")
        if len(task) > MAX_TASK_CHARS:
            raise RequestError(f"the instruction has {len(task)} characters; send at most {MAX_TASK_CHARS}")
        return task


def _check_pixels(image: np.ndarray, key: str) -> None:
    """The one rule for pixel values: uint8 in 0..255, or floats in [0, 1]. Any other integer type (a 16-bit depth or
    machine-vision camera) and floats outside [0, 1] (0..255 floats, [-1, 1] normalised ones) would reach the model
    unscaled: refused, saying how to convert."""
    if image.dtype.kind == "u" and image.dtype != np.uint8:
        raise RequestError(
            f"camera {key!r} is {image.dtype} (values up to {int(image.max())}); send uint8 in 0..255 (a 16-bit "
            "image: (image >> 8).astype(np.uint8)) or float in [0, 1]"
        )
    if image.dtype.kind == "f" and image.size and np.isfinite(image).all():  # NaN and inf: the pipeline's own check
        lo, hi = float(image.min()), float(image.max())
        if lo < 0.0 or hi > 1.0:
            raise RequestError(
                f"camera {key!r} is {image.dtype} with values in [{lo:g}, {hi:g}]; float images must lie in [0, 1]: "
                "send uint8 0..255 (image.astype(np.uint8)), or divide 0..255 floats by 255"
            )


# --- a connection's state history ---------------------------------------------------------------------------------


class ConnectionHistory:
    """One connection's state history, for a policy with ``n_obs_steps`` = n > 1 served one state a message: the
    last n states its messages carried, oldest first, the episode's first repeated until there are n (the
    ``StateHistory`` the rollout loop and ``select_action`` keep, so the frames are the ones training padded). It
    starts again on a message whose ``reset`` is true and after ``reset_after_s`` without a message. A message that
    carries its own ``[n, S]`` history passes through untouched."""

    def __init__(self, n: int, reset_after_s: float, clock: Callable[[], float] = time.monotonic):
        self.n, self.reset_after_s, self.clock = n, reset_after_s, clock
        self._history: StateHistory | None = None
        self._frames = 0  # states of this episode in the history (at most n)
        self._last: float | None = None  # when the last state arrived

    def __call__(self, item: Item) -> Item:
        if self.n == 1 or item.state is None or item.state.ndim == 2:  # no history, or the client's own [n, S]
            return item
        now = self.clock()
        idle = self._last is not None and now - self._last > self.reset_after_s
        if self._history is None or item.reset or idle:
            self._history, self._frames = StateHistory(self.n), 0
        self._last = now
        frames = self._history.push(item.state)  # [S] each, oldest first
        self._frames = min(self._frames + 1, self.n)
        return dataclasses.replace(item, state=torch.stack(frames), history_frames=self._frames)  # [n, S]
