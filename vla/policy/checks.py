"""The pipeline's first step: a batch checked as the policy needs it (``CheckBatch``: the state, one task per row,
the cameras, the action chunks in training) before any work, each fault a ``ValueError`` that names it and the fix;
``checked_state`` is the same check for the state alone (serving reads it too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data.reader import IMAGE_PREFIX
from vla.names import suggestion

Batch = dict[str, Any]


@dataclass(frozen=True)
class CheckBatch:
    """A batch as the pipeline needs it: state float64 [B, S] (``[B, n, S]``, the last ``obs_steps = n`` frames,
    when n > 1), one task string per row, the cameras, and (in training) action chunks [B, T, D]. Anything else is
    a clear error here, before any work. ``state_dim=0``: a policy without state (image-only); the state is then
    ``[B, 0]`` whatever the batch holds. Cameras given with a frame axis (LeRobot's loader with ``n_obs_steps`` > 1:
    [B, n, 3, H, W]) keep their last frame: only the state has a history."""

    state_dim: int
    image_keys: tuple[str, ...]
    time_horizon: int
    action_dim: int
    actions: bool  # True in training (chunks required); False for prompts (any action key is dropped)
    obs_steps: int = 1

    def __call__(self, batch: Batch) -> Batch:
        if not isinstance(batch, dict):
            raise ValueError(f"the batch must be a dict of arrays, got {type(batch).__name__}")
        if self.state_dim == 0:  # an image-only policy: no state in the prefix (a state given is not read)
            state = np.zeros((_rows(batch, self.image_keys), 0))
        else:
            state = checked_state(_numpy(batch, OBS_STATE), self.state_dim, self.obs_steps)
        tasks = batch.get("task")
        if tasks is None:
            raise ValueError(
                "the batch lacks 'task' (the instruction, a string per sample); add e.g. batch['task'] = ['push']"
            )
        tasks = [tasks] * len(state) if isinstance(tasks, str) else list(tasks)
        if len(tasks) != len(state):
            raise ValueError(f"batch['task'] holds {len(tasks)} strings for {len(state)} states; pass one per sample")
        for key in self.image_keys:
            if key not in batch:
                cams = [k for k in batch if str(k).startswith(IMAGE_PREFIX)]
                raise ValueError(
                    f"the observation lacks camera {key!r}, which the policy was trained with{suggestion(key, cams)} "
                    f"(cameras present: {', '.join(cams) or 'none'})"
                )
        out = {**batch, OBS_STATE: state, "task": tasks}
        for key in self.image_keys:
            if self.obs_steps > 1 and getattr(batch[key], "ndim", 0) == 5:  # [B, n, 3, H, W]: the current frame
                out[key] = batch[key][:, -1]
        out.pop(ACTION, None)
        if self.actions:
            actions = _numpy(batch, ACTION)
            t, d = self.time_horizon, self.action_dim
            if actions.ndim != 3 or actions.shape[1:] != (t, d):
                raise ValueError(
                    f"batch['{ACTION}'] has shape {tuple(actions.shape)}, expected [B, {t}, {d}]; load the dataset "
                    f"with delta_timestamps for {t} action steps (config.action_delta_indices)"
                )
            if len(actions) != len(state):
                raise ValueError(f"batch['{ACTION}'] holds {len(actions)} chunks for {len(state)} observations")
            if not np.isfinite(actions).all():
                row = int(np.flatnonzero(~np.isfinite(actions).all(axis=(1, 2)))[0])
                raise ValueError(f"batch['{ACTION}'] holds NaN or inf (chunk {row}); clean the dataset's actions")
            out[ACTION] = actions
        return out


def checked_state(state: np.ndarray, state_dim: int, obs_steps: int = 1) -> np.ndarray:
    """A state ``[S]`` or ``[B, S]`` -> float64 ``[B, S]`` (with ``obs_steps = n`` > 1: ``[B, n, S]``, the last n
    frames oldest first), or a ``ValueError`` naming the shape or the NaN."""
    state = np.asarray(state, dtype=np.float64)
    if obs_steps > 1:
        if state.ndim != 3 or state.shape[1:] != (obs_steps, state_dim):
            raise ValueError(
                f"batch['{OBS_STATE}'] has shape {tuple(state.shape)} but the policy reads the last {obs_steps} "
                f"frames of a {state_dim}-D state (n_obs_steps={obs_steps}); pass [B, {obs_steps}, {state_dim}], "
                "oldest first (select_action keeps the history itself; at an episode's start repeat the first frame)"
            )
    else:
        state = state[None] if state.ndim == 1 else state
        if state.ndim != 2 or state.shape[1] != state_dim:
            raise ValueError(
                f"batch['{OBS_STATE}'] has shape {tuple(state.shape)} but the policy was trained on a "
                f"{state_dim}-D state; pass [B, {state_dim}] (was the robot or the state key changed?)"
            )
    if not np.isfinite(state).all():
        row = int(np.flatnonzero(~np.isfinite(state.reshape(len(state), -1)).all(axis=1))[0])
        raise ValueError(f"batch['{OBS_STATE}'] holds NaN or inf (row {row}); check the robot's state reading")
    return state


def _rows(batch: Batch, image_keys: tuple[str, ...]) -> int:
    """How many observations a batch without state holds: its tasks, else its first camera's batch size."""
    tasks = batch.get("task")
    if tasks is not None and not isinstance(tasks, str):
        return len(tasks)
    for key in image_keys:
        if key in batch:
            shape = tuple(getattr(batch[key], "shape", np.shape(batch[key])))
            return shape[0] if len(shape) == 4 else 1
    return 1


def _numpy(batch: Batch, key: str) -> np.ndarray:
    if key not in batch:
        raise ValueError(
            f"the batch lacks {key!r}{suggestion(key, map(str, batch))} (keys: {', '.join(map(str, batch))})"
        )
    value = batch[key]
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().double().numpy()
    return np.asarray(value, dtype=np.float64)
