"""The data pipeline, written once: observation and action in -> normalise -> tokenise -> build the sequence;
ids out -> detokenise -> unnormalise. Training, evaluation, comparison and serving all run these lists.

Each step is a small frozen dataclass over a *batch* (a dict, the contract below), returning a new dict:

    "observation.state"            float [B, S]          raw, then normalised by Normalize ([B, 0] without state);
                                   float [B, n, S]       with ``n_obs_steps = n`` > 1: the last n frames, oldest first
    "observation.images.<camera>"  float [B, 3, H, W]    in [0, 1] (uint8 accepted), one per camera
    "task"                         list[str], B          the instruction
    "action"                       float [B, T, D]       raw, then normalised (training), or decoded (outputs)
    "action_is_pad"                bool [B, T]           past the episode's end (reported only)
    "images"                       float [B, N, 3, S, S] the cameras stacked and resized (StackImages)
    "action_ids"                   list[list[int]]       action-tokenizer ids (TokenizeActions, or generated)
    "sequence"                     vla.model.sequence.Sequence the packed rows the model reads (BuildSequence/BuildPrompt)
    "valid", "errors"              bool [B], list         per chunk: decoded validly, and why not (outputs)
    "committed_actions"            list of float [d, D]   raw, per row: the actions that will run before the chunk
                                                          arrives (committed-prefix decoding; ``vla.execution``)
    "forced_ids"                   list[list[int]]        the ids each chunk must begin with (CommitActions)
    "committed_input"              float [B, n * D + n]   committed actions shown to the prefix beside the state
                                                          (ShowCommitted; ``VLAConfig.commit_condition`` = n)

With relative actions (``VLAConfig.relative_actions``, openpi's ``DeltaActions``) ``RelativeActions`` runs before
``Normalize`` in training, and ``AbsoluteActions`` after ``Unnormalize`` on the way out, adding the raw
``observation.state`` back, so decoded chunks are always absolute.

``Pipeline.training`` runs in DataLoader workers through ``Collate`` (a ``collate_fn`` that returns the packed
batch), so ``policy.forward`` only moves tensors and computes the loss; ``step_through`` yields every
intermediate for debugging (``vla inspect`` draws them).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import action_tokenizers as at
import numpy as np
import torch
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.execution import COMMITTED
from vla.model.sequence import SequenceLayout
from vla.policy.checks import CheckBatch, _numpy
from vla.policy.commit_search import checked_committed
from vla.policy.images import IMAGES, ShiftImages, StackImages

Batch = dict[str, Any]
ACTION_IDS, SEQUENCE, FORCED_IDS = "action_ids", "sequence", "forced_ids"
COMMITTED_INPUT = "committed_input"  # float [B, n * D + n]: committed actions as the prefix reads them (ShowCommitted)
# What a policy built without statistics (from its config and features alone) says of a batch it cannot normalise
WITHOUT_STATS = (
    "this policy holds no normalisers (it was built from its config and features alone), so it cannot read raw "
    "observations or return raw actions: build it with its dataset (LeRobot's make_policy passes dataset_meta, and "
    "the normalisers come from its frames as vla train computes them), with dataset_stats=..., or with "
    "action_normalizer= and state_normalizer="
)


class Transform(Protocol):
    def __call__(self, batch: Batch) -> Batch: ...


# --- in ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RelativeActions:
    """Absolute chunks [B, T, D] -> relative to the current state on the masked dimensions (raw units, before
    ``Normalize``): ``action[:, :, i] -= state[:, action_state_dims[i]]`` where ``mask[i]``; grippers stay absolute.
    openpi's ``DeltaActions``; ``AbsoluteActions`` is its inverse on the way out."""

    mask: tuple[bool, ...]
    action_state_dims: tuple[int, ...]

    def __call__(self, batch: Batch) -> Batch:
        if ACTION not in batch:
            return batch
        return {**batch, ACTION: batch[ACTION] - _state_offset(batch, self.mask, self.action_state_dims)}


@dataclass(frozen=True)
class Normalize:
    """Raw state and actions -> normalised (q01..q99 -> [-1, 1] by default), each when present."""

    state: at.Normalizer | None
    action: at.Normalizer | None  # None: a policy built without statistics, which refuses (WITHOUT_STATS)

    def __call__(self, batch: Batch) -> Batch:
        if self.action is None:
            raise ValueError(WITHOUT_STATS)
        out = dict(batch)
        if self.state is not None and OBS_STATE in batch:
            out[OBS_STATE] = self.state.normalize(batch[OBS_STATE])
        if ACTION in batch:
            out[ACTION] = self.action.normalize(batch[ACTION])
        return out


@dataclass(frozen=True)
class TokenizeActions:
    """Normalised chunks [B, T, D] -> ``action_ids``.

    Encoding is a pure function of the chunk, and training meets every chunk once per epoch: the ids of each chunk
    seen are kept (up to ``cache_size`` chunks, keyed by a 128-bit BLAKE2 digest of its float64 values), so only
    chunks not met before are encoded. A FAST chunk of 50 x 14 costs ~5 ms to encode and ~5 us to look up.
    """

    tokenizer: at.ActionTokenizer
    cache_size: int = 1 << 20  # chunks whose ids are kept; 0 encodes every chunk every time
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, batch: Batch) -> Batch:
        chunks = np.ascontiguousarray(batch[ACTION], dtype=np.float64)
        if not self.cache_size:
            return {**batch, ACTION_IDS: self.tokenizer.encode(chunks)}
        keys = [hashlib.blake2b(chunk.tobytes(), digest_size=16).digest() for chunk in chunks]
        new = [i for i, k in enumerate(keys) if k not in self._cache]
        if new:
            encoded = self.tokenizer.encode(chunks[new])
            for i, ids in zip(new, encoded):
                if len(self._cache) < self.cache_size:
                    self._cache[keys[i]] = tuple(ids)
            fresh = dict(zip(new, encoded))
        else:
            fresh = {}
        return {
            **batch,
            ACTION_IDS: [list(fresh[i]) if i in fresh else list(self._cache[k]) for i, k in enumerate(keys)],
        }


@dataclass(frozen=True)
class BuildSequence:
    """Training rows: prefix + ``"Action: "`` + ids + ``"|"`` + EOS, right-padded (loss on the suffix)."""

    layout: SequenceLayout

    def __call__(self, batch: Batch) -> Batch:
        return {
            **batch,
            SEQUENCE: self.layout.build_training_sequence(batch["task"], batch[OBS_STATE], batch[ACTION_IDS]),
        }


@dataclass(frozen=True)
class BuildPrompt:
    """Inference rows: prefix + ``"Action: "``, left-padded, for ``vla.model.decode.generate``."""

    layout: SequenceLayout

    def __call__(self, batch: Batch) -> Batch:
        return {**batch, SEQUENCE: self.layout.build_prefix(batch["task"], batch[OBS_STATE])}


@dataclass(frozen=True)
class CommitActions:
    """The actions that will run before the chunk arrives (``committed_actions``: raw, per row ``[d, D]``, ``d`` may
    be 0) -> the ids the chunk must begin with (``forced_ids``): each made relative to the state where the policy's
    actions are, normalised and spelled by the tokenizer (``ActionTokenizer.prefix_ids``: time-local tokenizers
    only). The model then decodes the rest of the chunk after them. Runs before ``Normalize`` (it reads the raw
    state). A tokenizer whose ids mix the chunk's steps passes them on untouched: the policy searches its decoded
    chunks for them instead (``VLAConfig.commit_search``)."""

    tokenizer: at.ActionTokenizer
    action: at.Normalizer | None
    time_horizon: int
    relative: RelativeActions | None = None

    def __call__(self, batch: Batch) -> Batch:
        if COMMITTED not in batch:
            return batch
        rows = committed_rows(batch, self.action, self.relative, self.time_horizon)
        if not self.tokenizer.time_local:  # ids that mix the chunk's steps: the policy searches its chunks instead
            return batch
        forced = [self.tokenizer.prefix_ids(actions[None])[0] if len(actions) else [] for actions in rows]
        return {**batch, FORCED_IDS: forced}


def committed_rows(
    batch: Batch, action: at.Normalizer | None, relative: RelativeActions | None, time_horizon: int
) -> list[np.ndarray]:
    """Each row's raw ``committed_actions`` as the model predicts actions: checked (finite, at most a chunk, one
    entry per row), made relative to the raw state where the policy's actions are, and normalised; float [d, D]
    (d may be 0). What ``CommitActions`` forces and ``ShowCommitted`` shows."""
    if action is None:
        raise ValueError(WITHOUT_STATS)
    b = len(batch["task"])
    if len(batch[COMMITTED]) != b:
        raise ValueError(f"committed actions for {len(batch[COMMITTED])} rows in a batch of {b}: send one per row")
    offset = None
    if relative is not None:
        offset = _state_offset(batch, relative.mask, relative.action_state_dims)[:, 0]  # [B, D]
    rows = checked_committed(batch[COMMITTED], len(np.atleast_1d(action.scale)), time_horizon)
    return [
        action.normalize(actions - offset[r] if offset is not None else actions) if len(actions) else actions
        for r, actions in enumerate(rows)
    ]


@dataclass(frozen=True)
class ShowCommitted:
    """Committed-prefix conditioning (``VLAConfig.commit_condition`` = n): what the prefix reads of the actions that
    run before the chunk lands, ``committed_input`` [B, n * D + n]: the first d <= n of them normalised (zeros after),
    then a mask (1 for each step given). ``AppendCommitted`` puts it beside the normalised state.

    In training (``sample=True``, after ``Normalize``) each row shows its own chunk's first d actions (the batch's
    ``action``, normalised and relative as the model predicts it), so the model learns to continue them: none for
    half the chunks, as many requests have nothing running, else d in 1..n, uniformly over the chunks. d is drawn
    from a digest of the chunk itself (``shown``), not from a random state, so a run is the same batch for batch
    whatever its DataLoader workers and when resumed.
    In a prompt (before ``Normalize``: it reads the raw state) the raw ``committed_actions`` are made relative where
    the policy's actions are and normalised; rows without any (the episode's first request, no delay) show none.
    More than n are cut to the first n."""

    n: int
    action_dim: int
    time_horizon: int
    action: at.Normalizer | None = None
    relative: RelativeActions | None = None
    sample: bool = False

    def shown(self, chunks: np.ndarray) -> np.ndarray:
        """int [B]: how many of each training chunk's first actions it shows: 0 for about half of the chunks, else
        1..min(n, T), read off a digest of the chunk's values."""
        digests = [hashlib.blake2b(c.tobytes(), digest_size=8).digest() for c in np.ascontiguousarray(chunks)]
        draws = np.array([int.from_bytes(d, "little") for d in digests], dtype=np.uint64)
        most = min(self.n, self.time_horizon)
        return np.where(draws % 2 == 0, 0, 1 + (draws >> np.uint64(1)) % np.uint64(most)).astype(np.int64)

    def __call__(self, batch: Batch) -> Batch:
        b = len(batch["task"])
        values, mask = np.zeros((b, self.n, self.action_dim)), np.zeros((b, self.n))
        if self.sample:
            chunks = np.asarray(_numpy(batch, ACTION), dtype=np.float64)
            mask[np.arange(self.n)[None] < self.shown(chunks)[:, None]] = 1.0
            head = chunks[:, : self.n]
            values[:, : head.shape[1]] = head * mask[:, : head.shape[1], None]
        elif COMMITTED in batch:
            for r, actions in enumerate(committed_rows(batch, self.action, self.relative, self.time_horizon)):
                actions = actions[: self.n]
                values[r, : len(actions)] = actions
                mask[r, : len(actions)] = 1.0
        return {**batch, COMMITTED_INPUT: np.concatenate([values.reshape(b, -1), mask], axis=1).astype(np.float32)}


@dataclass(frozen=True)
class AppendCommitted:
    """The normalised state [B, S] (after ``EncodeHistory``) with ``committed_input`` after it: [B, S + n * D + n],
    what the state encoder reads."""

    def __call__(self, batch: Batch) -> Batch:
        state, extra = batch[OBS_STATE], batch[COMMITTED_INPUT]
        if isinstance(state, torch.Tensor):
            return {**batch, OBS_STATE: torch.cat([state, torch.as_tensor(extra, dtype=state.dtype)], dim=1)}
        return {**batch, OBS_STATE: np.concatenate([np.asarray(state, dtype=np.float32), extra], axis=1)}


@dataclass(frozen=True)
class EncodeHistory:
    """A normalised state history [B, n, S] (oldest first) -> what the prefix reads, [B, n * S]: the current frame,
    then its change since each earlier frame, ``scale * (s_t - s_{t-k})`` for k = 1 .. n-1. A frame's motion is a
    few hundredths of the normalised range, too small beside the positions for a small network to read at once:
    ``scale`` (per state dim, ``VLAConfig.state_delta_scale``, fitted by ``vla train`` so one frame's changes span
    about [-1, 1]) brings them to the positions' size. Nothing to do for a state [B, S]."""

    scale: tuple[float, ...] | None

    def __call__(self, batch: Batch) -> Batch:
        state = batch.get(OBS_STATE)
        if state is None or state.ndim != 3:
            return batch
        current = state[:, -1:]  # [B, 1, S]
        changes = (current - state[:, -2::-1]) * np.asarray(self.scale if self.scale is not None else 1.0)
        return {**batch, OBS_STATE: np.concatenate([current, changes], axis=1).reshape(len(state), -1)}


def current_state(state: Any) -> Any:
    """[B, S] of a state [B, S] or of a history [B, n, S] (its last frame): what relative actions are measured from."""
    return state[:, -1] if state.ndim == 3 else state


# --- out -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DetokenizeActions:
    """``action_ids`` -> normalised chunks [B, T, D]; ``valid`` is the generation's and the tokenizer's verdict.
    Invalid rows are NaN (the tokenizer's ``mark`` mode): the policy decides the fallback and counts it."""

    tokenizer: at.ActionTokenizer
    time_horizon: int
    action_dim: int

    def __call__(self, batch: Batch) -> Batch:
        out = self.tokenizer.decode(batch[ACTION_IDS], self.time_horizon, self.action_dim, mode="mark")
        valid = out.valid & np.asarray(batch.get("valid", True), dtype=bool)
        errors = [g or t for g, t in zip(batch.get("errors") or [None] * len(valid), out.errors)]
        actions = out.actions.copy()
        actions[~valid] = np.nan
        return {**batch, ACTION: actions, "valid": valid, "errors": errors}


@dataclass(frozen=True)
class Unnormalize:
    """Normalised chunks -> raw units (NaN rows stay NaN)."""

    action: at.Normalizer | None

    def __call__(self, batch: Batch) -> Batch:
        if self.action is None:
            raise ValueError(WITHOUT_STATS)
        return {**batch, ACTION: self.action.unnormalize(batch[ACTION])}


@dataclass(frozen=True)
class AbsoluteActions:
    """Relative chunks (raw units, after ``Unnormalize``) -> absolute: the raw state added back on the masked
    dimensions. Needs the observation's raw ``observation.state`` in the batch (NaN rows stay NaN)."""

    mask: tuple[bool, ...]
    action_state_dims: tuple[int, ...]

    def __call__(self, batch: Batch) -> Batch:
        return {**batch, ACTION: batch[ACTION] + _state_offset(batch, self.mask, self.action_state_dims)}


def _state_offset(batch: Batch, mask: tuple[bool, ...], action_state_dims: tuple[int, ...]) -> np.ndarray:
    """float [B, 1, D]: the raw state's value of each masked action dimension, 0 elsewhere."""
    if OBS_STATE not in batch:
        raise ValueError(
            f"relative actions need the raw batch['{OBS_STATE}'] to add the state back; pass the "
            "observation's state with the generated ids"
        )
    state = np.asarray(_numpy(batch, OBS_STATE), dtype=np.float64)
    state = current_state(state[None] if state.ndim == 1 else state)  # [B, S]
    offset = state[:, list(action_state_dims)] * np.asarray(mask, dtype=np.float64)  # [B, D]
    return offset[:, None, :]


# --- the lists -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pipeline:
    """The three lists of one policy: ``training`` (sample batch -> packed sequence), ``prompt`` (observation
    -> prompt) and ``outputs`` (generated ids -> raw chunks)."""

    training: tuple[Transform, ...]
    prompt: tuple[Transform, ...]
    outputs: tuple[Transform, ...]

    @property
    def measuring(self) -> tuple[Transform, ...]:
        """``training`` without its random augmentation: held-out losses are measured on the images as they are, and
        with no committed actions shown."""
        return tuple(
            dataclasses.replace(step, sample=False) if isinstance(step, ShowCommitted) else step
            for step in self.training
            if not isinstance(step, ShiftImages)
        )

    @classmethod
    def build(
        cls,
        *,
        tokenizer: at.ActionTokenizer,
        state_normalizer: at.Normalizer | None,
        action_normalizer: at.Normalizer | None,
        layout: SequenceLayout,
        state_dim: int,
        time_horizon: int,
        action_dim: int,
        image_keys: Sequence[str] = (),
        image_size: int = 0,
        image_shift: int = 0,
        relative_actions: Sequence[bool] | None = None,
        action_state_dims: Sequence[int] | None = None,
        obs_steps: int = 1,
        state_delta_scale: Sequence[float] | None = None,
        commit_condition: int = 0,
    ) -> Pipeline:
        """``image_shift``: pixels of random shift in training (``ShiftImages``; 0 = none).
        ``relative_actions``: a mask per action dimension (None = all absolute); the model then predicts those
        dimensions relative to the state's ``action_state_dims``, and the action normaliser must be fitted on them.
        ``commit_condition`` = n > 0: up to n committed actions shown beside the state (``ShowCommitted``)."""
        shapes = (state_dim, tuple(image_keys), time_horizon, action_dim)
        normalize = Normalize(state_normalizer, action_normalizer)
        history = (
            (EncodeHistory(None if state_delta_scale is None else tuple(state_delta_scale)),) if obs_steps > 1 else ()
        )
        images = StackImages(tuple(image_keys), image_size)
        relative = absolute = ()
        if relative_actions is not None and any(relative_actions):
            parts = (tuple(bool(m) for m in relative_actions), tuple(int(i) for i in action_state_dims))
            relative, absolute = (RelativeActions(*parts),), (AbsoluteActions(*parts),)
        shown = functools.partial(ShowCommitted, commit_condition, action_dim, time_horizon)
        sample, show, append = (), (), ()
        if commit_condition:
            sample, append = (shown(sample=True),), (AppendCommitted(),)
            show = (shown(action=action_normalizer, relative=relative[0] if relative else None),)
        return cls(
            training=(
                CheckBatch(*shapes, actions=True, obs_steps=obs_steps),
                *relative,
                normalize,
                *sample,
                *history,
                *append,
                images,
                ShiftImages(image_shift),
                TokenizeActions(tokenizer),
                BuildSequence(layout),
            ),
            prompt=(
                CheckBatch(*shapes, actions=False, obs_steps=obs_steps),
                *(
                    show
                    or (CommitActions(tokenizer, action_normalizer, time_horizon, relative[0] if relative else None),)
                ),
                normalize,
                *history,
                *append,
                images,
                BuildPrompt(layout),
            ),
            outputs=(DetokenizeActions(tokenizer, time_horizon, action_dim), Unnormalize(action_normalizer), *absolute),
        )

    def step_through(self, batch: Batch, direction: str = "training") -> Iterator[tuple[str, Batch]]:
        """Every intermediate of ``direction`` (``training``, ``prompt`` or ``outputs``): (step name, batch)."""
        for step in getattr(self, direction):
            batch = step(batch)
            yield type(step).__name__, batch


def run(steps: Sequence[Transform], batch: Batch) -> Batch:
    for step in steps:
        batch = step(batch)
    return batch


@dataclass(frozen=True)
class Collate:
    """A DataLoader ``collate_fn``: samples -> one batch -> the training steps, so tokenising and packing run in
    the loader's workers. Returns only what the model needs: ``sequence``, ``images`` and a few numbers to log."""

    steps: tuple[Transform, ...]

    def __call__(self, samples: list[Batch]) -> Batch:
        return packed(run(self.steps, torch.utils.data.default_collate(samples)))


def packed(batch: Batch) -> Batch:
    """A batch after the training steps -> what the model reads (``sequence``, ``images``) and a few numbers to log."""
    out = {
        SEQUENCE: batch[SEQUENCE],
        "tokens_per_chunk": torch.tensor([len(r) for r in batch[ACTION_IDS]]).float().mean(),
    }
    if IMAGES in batch:
        out[IMAGES] = batch[IMAGES]
    if "action_is_pad" in batch:
        out["action_pad_fraction"] = torch.as_tensor(batch["action_is_pad"]).float().mean()
    return out
