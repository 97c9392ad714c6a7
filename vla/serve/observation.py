"""What a robot sends, checked and converted before it reaches the policy: one decoded message -> an ``Item``
(state, cameras resized on the server, the instruction), or a ``RequestError`` saying what is wrong (the server
answers it and keeps the connection open)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vla.pipeline import camera_image, checked_state

MAX_TASK_CHARS = 1000
MAX_IMAGE_SIDE = 4096


class RequestError(ValueError):
    """A request the server answers with an error reply (the connection stays open)."""


@dataclass
class Item:
    """One observation, checked and converted: what a batch is stacked from."""

    state: torch.Tensor  # float32 [S]
    images: dict[str, torch.Tensor]  # policy key -> float32 [3, H, W] in [0, 1]
    task: str
    request_id: Any = None

    @property
    def group(self) -> tuple:
        """Observations with equal image shapes can share one batch."""
        return tuple((k, tuple(v.shape)) for k, v in sorted(self.images.items()))


class ObservationReader:
    """A decoded message -> an ``Item`` for a policy with these keys and shapes; ``RequestError`` says what is wrong."""

    def __init__(self, state_dim: int, image_keys: list[str], image_size: int | None, keys: dict[str, str]):
        self.state_dim = int(state_dim)
        self.image_keys = list(image_keys)
        self.image_size = image_size
        self.renames = {k.replace("/", "."): v for k, v in keys.items()}
        self.aliases = {"state": "observation.state", "task": "prompt"}
        for key in self.image_keys:
            self.aliases[key.replace("observation.images.", "images.")] = key
        if len(self.image_keys) == 1:
            self.aliases["image"] = self.aliases["observation.image"] = self.image_keys[0]

    def expected(self) -> dict[str, str]:
        """What the metadata tells clients to send."""
        out = {"observation.state": f"float [{self.state_dim}]", "prompt": "str (or 'task')"}
        for key in self.image_keys:
            out[key] = "uint8 [H, W, 3] (or [3, H, W], or float in [0, 1]); resized on the server"
        return out

    def __call__(self, message: Any) -> Item:
        if not isinstance(message, dict):
            raise RequestError(f"an observation is a map of keys to values, got {type(message).__name__}")
        obs: dict[str, Any] = {}
        for key, value in message.items():
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            if not isinstance(key, str):
                raise RequestError(f"observation keys must be strings, got {key!r}")
            name = self.renames.get(key.replace("/", "."), key.replace("/", "."))
            obs[self.aliases.get(name, name)] = value
        request_id = obs.get("request_id")
        if request_id is not None and not isinstance(request_id, (int, str)):
            raise RequestError(f"request_id must be an int or a string, got {type(request_id).__name__}")
        return Item(self._state(obs), {k: self._image(obs, k) for k in self.image_keys}, self._task(obs), request_id)

    def _state(self, obs: dict[str, Any]) -> torch.Tensor:
        if "observation.state" not in obs:
            raise RequestError(f"the observation lacks 'observation.state' (keys sent: {', '.join(sorted(obs))}); "
                               f"send the robot state as float [{self.state_dim}]")  # fmt: skip
        try:  # the policy pipeline's own check: one observation, [S] or [1, S]
            state = checked_state(np.asarray(obs["observation.state"], dtype=np.float32), self.state_dim)
        except (TypeError, ValueError) as err:
            raise RequestError(str(err) if isinstance(err, ValueError) else "observation.state must be numbers") from None
        if len(state) != 1:
            raise RequestError(f"observation.state holds {len(state)} states; send one observation per message")
        return torch.from_numpy(state[0].astype(np.float32))

    def _image(self, obs: dict[str, Any], key: str) -> torch.Tensor:
        if key not in obs:
            raise RequestError(f"the observation lacks camera {key!r} (keys sent: {', '.join(sorted(obs))}); "
                               "send it as uint8 [H, W, 3]")  # fmt: skip
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


# --- batching -----------------------------------------------------------------------------------------------------
