"""The policy: a LeRobot ``PreTrainedPolicy`` that owns the prefix-LM, the action tokenizer and the normalisers.

    policy = VLAPolicy(VLAConfig(time_horizon=10, n_action_steps=5, image_keys=["observation.images.corner2"]),
                       action_tokenizer=tok, action_normalizer=a_norm, state_normalizer=s_norm)
    loss, metrics = policy.forward(batch)            # training: raw units in, loss on the action segment out
    chunk = policy.predict_action_chunk(obs)         # [B, T, D] raw units
    action = policy.select_action(obs)               # [B, D], from a queue refilled every n_action_steps
    policy.save_pretrained("ckpt/"); policy = VLAPolicy.from_pretrained("ckpt/")

The data path, written once each way:
    forward:  state -normalise-> bins in the prompt;  action [B, T, D] -normalise-> tokenizer.encode -> ids
              -> SequenceLayout.build_training_sequence -> PrefixLM.loss
    predict:  state -normalise-> SequenceLayout.build_prefix -> decode.generate (KV cache, constraint)
              -> tokenizer.decode -> unnormalise -> [B, T, D]

Batches are LeRobot's: ``observation.state`` [B, S], ``observation.images.<cam>`` [B, 3, H, W] floats in [0, 1],
``task`` list[str], ``action`` [B, T, D], ``action_is_pad`` [B, T]. Actions past an episode's end arrive as LeRobot
gives them (the last action repeated), so the whole chunk is tokenised; ``action_is_pad`` is only reported.

An invalid decode (possible only with ``constrained=False``) never passes silently: the row falls back to repeating
the previously executed action (or the normalised zero action, i.e. the middle of the data's range, before any
action was executed), is counted in ``policy.decode_stats`` and logged.

Saved files (``save_pretrained``, written to a temporary folder and renamed into place):
    config.json              the VLAConfig (LeRobot's format, with "type": "vla")
    model.safetensors        the weights
    backbone_config.json     the exact PaliGemmaConfig, so loading never depends on preset definitions
    action_tokenizer/        tok.save_pretrained
    action_normalizer.json, state_normalizer.json
    text_tokenizer/          only for the PaliGemma vocabulary (a copy of the Gemma tokenizer.json)
    policy_{pre,post}processor.json   LeRobot's processor pipelines (batch + device only), for lerobot-eval

LeRobot: the config registers as ``"vla"`` on ``PreTrainedConfig`` when this module is imported; ``make_policy``
finds ``VLAPolicy`` and ``make_vla_pre_post_processors`` here by LeRobot's naming convention (the module has no
``configuration_`` part, so both lookups land in it). Built by LeRobot's factory, the policy reads its tokenizer
from ``action_tokenizer_path`` and its normalisers from the dataset statistics. ``lerobot_train`` / ``lerobot_eval``
below are LeRobot's entry points with the policy registered:

    python -c "from vla.policy import lerobot_train; lerobot_train()" --policy.type=vla \
        --policy.action_tokenizer_path=outputs/tok --dataset.repo_id=local/push --dataset.root=data/push ...
    python -c "from vla.policy import lerobot_eval; lerobot_eval()" --policy.path=outputs/.../pretrained_model ...
"""

from __future__ import annotations

import difflib
import json
import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature, PreTrainedConfig
from lerobot.optim import AdamWConfig, CosineDecayWithWarmupSchedulerConfig
from lerobot.policies.pretrained import PreTrainedPolicy
from safetensors.torch import load_model, save_model

import action_tokenizers as at
from action_tokenizers.base import atomic_directory, write_json
from action_tokenizers.normalize import NORM_MODES

from .decode import VocabConstraint, generate
from .model import PRESETS, build_model
from .sequence import (
    PALIGEMMA_TEXT_VOCAB,
    STATE_ENCODINGS,
    TEXT_TOKENIZER_DIR,
    LocalTextTokenizer,
    SequenceLayout,
    VocabMap,
)

logger = logging.getLogger(__name__)

STATE = "observation.state"
ACTION = "action"
IMAGE_PREFIX = "observation.images."
WEIGHTS_FILE = "model.safetensors"
BACKBONE_CONFIG_FILE = "backbone_config.json"
TOKENIZER_DIR = "action_tokenizer"
ACTION_NORMALIZER_FILE = "action_normalizer.json"
STATE_NORMALIZER_FILE = "state_normalizer.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@PreTrainedConfig.register_subclass("vla")
@dataclass
class VLAConfig(PreTrainedConfig):
    """The policy's configuration. Every field can be set from LeRobot's CLI as ``--policy.<field>=...``."""

    push_to_hub: bool = False  # LeRobot's default is True; this project never reaches the network

    # --- backbone -----------------------------------------------------------------------------------------
    preset: str = "tiny"  # backbone size (vla.model.PRESETS): "tiny" (CPU), "small", "paligemma-3b"
    backbone_path: str | None = None  # local PaliGemma checkpoint folder (weights + tokenizer.json), for "paligemma-3b"
    attn_implementation: str = "sdpa"  # transformers attention kernel: "sdpa" or "eager"
    dtype: str = "float32"  # weights: "float32" or "bfloat16" (GPU)
    init_seed: int | None = None  # seeds the random initial weights; None uses the global RNG

    # --- shapes -------------------------------------------------------------------------------------------
    time_horizon: int = 10  # T: actions per predicted chunk (openpi's action_horizon)
    n_action_steps: int = 10  # actions executed from each chunk before predicting the next (<= time_horizon)
    action_dim: int | None = None  # D; None = from output_features, the tokenizer or the action normaliser
    state_dim: int | None = None  # S; None = from input_features or the state normaliser
    image_keys: list[str] = field(default_factory=list)  # cameras, "observation.images.<cam>"; empty = state + task
    image_size: int | None = None  # images are resized to this square size; None = the preset's (tiny: 64)

    # --- sequence -----------------------------------------------------------------------------------------
    max_prefix_len: int = 256  # most text tokens in the prefix (BOS + task + state); longer tasks are cut (logged)
    state_encoding: str = "text"  # "text": pi0-FAST's integers in the prompt; "embedding": an MLP's prefix embeddings
    state_bins: int = 256  # text: the normalised state is written as integers in [0, state_bins)
    state_tokens: int = 1  # embedding: prefix embeddings the state encoder writes
    # Compact vocabulary only: words given one id each (vla.sequence.prompt_words: the template's and the tasks').
    # Training fills it from the dataset's tasks; other text is spelled in bytes. Empty = bytes and numbers only.
    text_words: list[str] = field(default_factory=list)
    max_action_tokens: int | None = None  # most action ids generated per chunk; None = the constraint's max_length

    # --- decoding -----------------------------------------------------------------------------------------
    temperature: float = 0.0  # 0 = greedy; > 0 samples (openpi used 0.7 for bimanual tasks)
    top_p: float = 1.0  # nucleus sampling mass (with temperature > 0)
    constrained: bool = True  # mask logits with the tokenizer's constraint (False only for ablations)
    use_kv_cache: bool = True  # prefill once and decode from the KV cache (False recomputes every step)

    # --- tokenizer and normalisation when LeRobot's factory builds the policy ------------------------------
    action_tokenizer_path: str | None = None  # folder written by tok.save_pretrained (used when none is passed)
    action_norm_mode: str = "quantile"  # from dataset stats: "quantile" (q01/q99 -> +-1), "mean_std", "identity"
    state_norm_mode: str = "quantile"  # same choices, for observation.state
    # LeRobot's processors must not normalise: the policy does it with its own normalisers (above).
    normalization_mapping: dict[str, NormalizationMode] = field(
        default_factory=lambda: {
            "VISUAL": NormalizationMode.IDENTITY,
            "STATE": NormalizationMode.IDENTITY,
            "ACTION": NormalizationMode.IDENTITY,
        }
    )

    # --- optimiser and schedule (LeRobot presets; the FAST paper's recipe, higher lr for small models) -----
    optimizer_lr: float = 3e-4  # peak learning rate (pi0-FAST fine-tuning used 2.5e-5 on the 3B model)
    optimizer_betas: tuple[float, float] = (0.9, 0.95)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.01
    optimizer_grad_clip_norm: float = 1.0
    scheduler_warmup_steps: int = 1000
    scheduler_decay_steps: int = 30000
    scheduler_decay_lr: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.preset not in PRESETS:
            close = difflib.get_close_matches(str(self.preset), PRESETS, n=1, cutoff=0.4)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"preset {self.preset!r} is unknown{hint}; choose one of {', '.join(PRESETS)}")
        if self.backbone_path is not None and self.preset != "paligemma-3b":
            raise ValueError(f"backbone_path is set but preset is {self.preset!r}; set preset='paligemma-3b'")
        _check(self.attn_implementation in ("sdpa", "eager"), "attn_implementation", self.attn_implementation,
               "use 'sdpa' or 'eager'")  # fmt: skip
        _check(self.dtype in DTYPES, "dtype", self.dtype, f"use one of {', '.join(DTYPES)}")
        _check(self.time_horizon >= 1, "time_horizon", self.time_horizon, "use a positive number of steps")
        _check(1 <= self.n_action_steps <= self.time_horizon, "n_action_steps", self.n_action_steps,
               f"use 1 <= n_action_steps <= time_horizon ({self.time_horizon})")  # fmt: skip
        for name in ("action_dim", "state_dim", "image_size", "max_action_tokens"):
            value = getattr(self, name)
            _check(value is None or value >= 1, name, value, "use a positive integer or leave it unset (None)")
        bad = [k for k in self.image_keys if not k.startswith(IMAGE_PREFIX) or k == IMAGE_PREFIX]
        _check(not bad, "image_keys", bad, f"name cameras by their full key, e.g. '{IMAGE_PREFIX}front'")
        unique = len(set(self.image_keys)) == len(self.image_keys)
        _check(unique, "image_keys", self.image_keys, "list each camera once")
        _check(self.max_prefix_len >= 16, "max_prefix_len", self.max_prefix_len, "use at least 16 (256 is typical)")
        _check(self.state_bins >= 2, "state_bins", self.state_bins, "use at least 2 (256 is openpi's)")
        _check(self.state_encoding in STATE_ENCODINGS, "state_encoding", self.state_encoding,
               f"use one of {', '.join(STATE_ENCODINGS)}")  # fmt: skip
        _check(self.state_tokens >= 1, "state_tokens", self.state_tokens, "use a positive number (1 is typical)")
        _check(self.temperature >= 0, "temperature", self.temperature, "use 0 for greedy or a positive value")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "use a value in (0, 1]")
        for name in ("action_norm_mode", "state_norm_mode"):
            mode = getattr(self, name)
            _check(mode in NORM_MODES, name, mode, f"use one of {', '.join(NORM_MODES)}")

    # --- what LeRobot asks of a policy config ---------------------------------------------------------------
    @property
    def observation_delta_indices(self) -> None:
        return None  # the current observation only

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.time_horizon))  # the chunk: actions t .. t + T - 1

    @property
    def reward_delta_indices(self) -> None:
        return None

    def get_optimizer_preset(self) -> AdamWConfig:
        return AdamWConfig(
            lr=self.optimizer_lr,
            betas=self.optimizer_betas,
            eps=self.optimizer_eps,
            weight_decay=self.optimizer_weight_decay,
            grad_clip_norm=self.optimizer_grad_clip_norm,
        )

    def get_scheduler_preset(self) -> CosineDecayWithWarmupSchedulerConfig:
        return CosineDecayWithWarmupSchedulerConfig(
            peak_lr=self.optimizer_lr,
            decay_lr=self.scheduler_decay_lr,
            num_warmup_steps=self.scheduler_warmup_steps,
            num_decay_steps=self.scheduler_decay_steps,
        )

    def validate_features(self) -> None:
        """Reconcile the dimensions with LeRobot's features, filling whichever side is missing."""
        self.input_features = dict(self.input_features or {})
        self.output_features = dict(self.output_features or {})
        self._reconcile_dim(self.input_features, STATE, FeatureType.STATE, "state_dim")
        self._reconcile_dim(self.output_features, ACTION, FeatureType.ACTION, "action_dim")
        visual = [k for k, ft in self.input_features.items() if ft.type is FeatureType.VISUAL]
        for key in self.image_keys:
            if key in self.input_features:
                continue
            if visual:  # the data names its cameras: an unknown one is a typo, not a new camera
                close = difflib.get_close_matches(key, visual, n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"image_keys has {key!r}, which the data lacks{hint} (cameras: {', '.join(visual)})")
            size = self.image_size or PRESETS[self.preset].image_size
            self.input_features[key] = PolicyFeature(FeatureType.VISUAL, (3, size, size))

    def _reconcile_dim(self, features: dict, key: str, kind: FeatureType, name: str) -> None:
        """The data's feature sets ``name`` (which must agree if set); without one, ``name`` creates the feature."""
        feature, value = features.get(key), getattr(self, name)
        if feature is not None:
            n = int(feature.shape[-1])
            what = key.rsplit(".", 1)[-1]
            _check(value in (None, n), name, value, f"the data's {what} is {n}-D; set {n}")
            setattr(self, name, n)
        elif value is not None:
            features[key] = PolicyFeature(kind, (value,))


def _check(ok: bool, name: str, value: Any, fix: str) -> None:
    if not ok:
        raise ValueError(f"VLAConfig.{name} = {value!r} is invalid: {fix}")


@dataclass
class DecodeStats:
    """Running counts over every predicted chunk: nothing falls back silently."""

    chunks: int = 0
    invalid: int = 0  # chunks that did not decode (only possible with constrained=False)
    fallback_previous: int = 0  # ... replaced by the previously executed action, repeated
    fallback_zero: int = 0  # ... replaced by the normalised zero action (no previous action known)
    tokens: int = 0  # action ids generated for valid chunks

    @property
    def valid_rate(self) -> float:
        return 1.0 - self.invalid / self.chunks if self.chunks else 1.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "valid_rate": self.valid_rate}


@dataclass
class DecodeInfo:
    """About the last ``predict_action_chunk`` call, per chunk. Readable as attributes or keys (``info["valid"]``)."""

    valid: np.ndarray  # bool [B]
    tokens_per_chunk: np.ndarray  # int [B], action ids generated
    errors: list[str | None]
    latency_ms: float  # prompt building + decoding + detokenising, whole batch
    steps: int  # decoding steps (forward passes after the prefill)

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(f"{key!r}; DecodeInfo holds {', '.join(self.__dataclass_fields__)}")
        return getattr(self, key)


class VLAPolicy(PreTrainedPolicy):
    """PaliGemma-style prefix-LM over discrete action tokens, with LeRobot's policy interface."""

    config_class = VLAConfig
    name = "vla"

    def __init__(
        self,
        config: VLAConfig,
        *,
        action_tokenizer: at.ActionTokenizer | None = None,
        action_normalizer: at.Normalizer | None = None,
        state_normalizer: at.Normalizer | None = None,
        dataset_stats: dict[str, dict[str, Any]] | None = None,
        text_tokenizer_dir: str | Path | None = None,
        backbone_config: dict | None = None,
        **_: Any,  # LeRobot's factory also passes dataset_meta
    ):
        super().__init__(config)
        if action_tokenizer is None:
            action_tokenizer = _tokenizer_from_config(config)
        if action_normalizer is None:
            action_normalizer = _from_stats(dataset_stats, ACTION, config.action_norm_mode)
        if state_normalizer is None:
            state_normalizer = _from_stats(dataset_stats, STATE, config.state_norm_mode)
        self.action_tokenizer = action_tokenizer
        self.action_normalizer = action_normalizer
        self.state_normalizer = state_normalizer
        self._resolve_dims()
        config.validate_features()
        t, d = config.time_horizon, config.action_dim

        # The vocabulary: compact (bytes + actions) or PaliGemma's own, read from a local folder.
        text_dir = text_tokenizer_dir or config.backbone_path
        if text_dir is None:
            self.vocab = VocabMap.compact(self.action_tokenizer.vocab_size, words=config.text_words)
        else:
            text = LocalTextTokenizer(text_dir, size=PALIGEMMA_TEXT_VOCAB)
            self.vocab = VocabMap.paligemma(text, self.action_tokenizer.vocab_size)
        self.model = build_model(
            config.preset,
            self.vocab,
            image_size=config.image_size,
            num_cameras=len(config.image_keys),
            pretrained_path=config.backbone_path if backbone_config is None else None,
            backbone_config=backbone_config,
            attn_implementation=config.attn_implementation,
            dtype=DTYPES[config.dtype],
            seed=config.init_seed,
            state_dim=config.state_dim,
            state_tokens=config.state_tokens if config.state_encoding == "embedding" else 0,
        )
        self.layout = SequenceLayout(
            self.vocab,
            image_tokens=self.model.image_tokens,
            num_cameras=len(config.image_keys),
            max_prefix_len=config.max_prefix_len,
            state_bins=config.state_bins,
            state_encoding=config.state_encoding,
            state_tokens=config.state_tokens,
        )
        self.constraint = VocabConstraint(self.action_tokenizer.constraint(time_horizon=t, action_dim=d), self.vocab)
        self.max_new_tokens = (config.max_action_tokens or self.constraint.max_length) + 1  # + "|"
        if config.constrained and self.max_new_tokens < self.constraint.max_length + 1:
            raise ValueError(
                f"VLAConfig.max_action_tokens = {config.max_action_tokens} can cut constrained chunks (they need up "
                f"to {self.constraint.max_length} ids); raise it or leave it unset"
            )
        self.decode_stats = DecodeStats()
        self.last_decode_info: DecodeInfo | None = None
        self._queue: deque[torch.Tensor] = deque()
        self._previous_action: torch.Tensor | None = None  # [B, D] raw, the last action select_action returned

    def _resolve_dims(self) -> None:
        """Fill action_dim / state_dim from whatever knows them, and check everything agrees."""
        c, tok = self.config, self.action_tokenizer
        d_sources = {"config": c.action_dim, "action tokenizer": tok.action_dim,
                     "action normaliser": self.action_normalizer.dim}  # fmt: skip
        s_sources = {"config": c.state_dim, "state normaliser": self.state_normalizer.dim}
        for name, sources in (("action_dim", d_sources), ("state_dim", s_sources)):
            known = {k: int(v) for k, v in sources.items() if v is not None}
            if len(set(known.values())) > 1:
                raise ValueError(f"{name} disagrees: {known}; fit the tokenizer and normalisers on the same data")
            setattr(c, name, next(iter(known.values())))
        if tok.time_horizon is not None and tok.time_horizon != c.time_horizon:
            raise ValueError(
                f"the action tokenizer was fitted on chunks of {tok.time_horizon} steps but VLAConfig.time_horizon "
                f"is {c.time_horizon}; set time_horizon={tok.time_horizon} or fit a tokenizer on "
                f"{c.time_horizon}-step chunks"
            )

    # --- LeRobot's interface --------------------------------------------------------------------------------
    def get_optim_params(self):
        return self.parameters()

    def reset(self) -> None:
        """Call at every episode start: empties the action queue and forgets the previous action."""
        self._queue.clear()
        self._previous_action = None

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """Training loss on a LeRobot batch (raw units): cross-entropy on the action segment only."""
        tasks, states, images = self._observation(batch)
        actions = _tensor(batch, ACTION)
        t, d = self.config.time_horizon, self.config.action_dim
        if actions.ndim != 3 or tuple(actions.shape[1:]) != (t, d):
            raise ValueError(
                f"batch['action'] has shape {tuple(actions.shape)}, expected [B, {t}, {d}]; load the dataset with "
                f"delta_timestamps for {t} action steps (config.action_delta_indices)"
            )
        if len(actions) != len(tasks):
            raise ValueError(f"batch['action'] holds {len(actions)} chunks for {len(tasks)} observations")
        normalised = self.action_normalizer.normalize(actions.detach().cpu().double().numpy())
        ids = self.action_tokenizer.encode(normalised)
        seq = self.layout.build_training_sequence(tasks, states, ids)
        loss, metrics = self.model.loss(seq, images)
        metrics["tokens_per_chunk"] = float(np.mean([len(r) for r in ids]))
        if "action_is_pad" in batch:
            metrics["action_pad_fraction"] = float(torch.as_tensor(batch["action_is_pad"]).float().mean())
        return loss, metrics

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, Any], generator: torch.Generator | None = None, **_: Any
    ) -> torch.Tensor:
        """Action chunks ``[B, T, D]`` in raw units for a batch of observations (``generator``: for sampling)."""
        start = time.perf_counter()
        tasks, states, images = self._observation(batch)
        prompt = self.layout.build_prefix(tasks, states)
        gen = generate(
            self.model,
            prompt,
            vocab=self.vocab,
            constraint=self.constraint if self.config.constrained else None,
            images=images,
            max_new_tokens=self.max_new_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            use_cache=self.config.use_kv_cache,
            generator=generator,
        )
        out = gen.decode(self.action_tokenizer, self.config.time_horizon, self.config.action_dim)
        chunks = self.action_normalizer.unnormalize(np.nan_to_num(out.actions))  # [B, T, D] raw
        chunks = torch.as_tensor(chunks, dtype=torch.float32)
        self._fall_back(chunks, out.valid, out.errors)
        self.decode_stats.chunks += len(chunks)
        self.decode_stats.tokens += int(gen.tokens_per_chunk[out.valid].sum())
        self.last_decode_info = DecodeInfo(
            valid=out.valid, tokens_per_chunk=gen.tokens_per_chunk, errors=out.errors,
            latency_ms=(time.perf_counter() - start) * 1000, steps=gen.steps,
        )  # fmt: skip
        return chunks.to(_tensor(batch, STATE).device)

    def _fall_back(self, chunks: torch.Tensor, valid: np.ndarray, errors: list[str | None]) -> None:
        """Replace invalid chunks in place: previous action repeated, else the normalised zero action. Counted."""
        bad = np.flatnonzero(~valid)
        if not len(bad):
            return
        zero = self.action_normalizer.unnormalize(np.zeros(self.config.action_dim))  # the middle of the data's range
        zero = torch.as_tensor(zero, dtype=torch.float32)
        previous = self._previous_action
        for i in bad:
            if previous is not None and len(previous) == len(chunks):
                chunks[i] = previous[i].cpu()
                self.decode_stats.fallback_previous += 1
            else:
                chunks[i] = zero
                self.decode_stats.fallback_zero += 1
        self.decode_stats.invalid += len(bad)
        logger.warning(
            "%d of %d chunks did not decode (first: %s); fell back to the previous/zero action. decode_stats: %s",
            len(bad), len(chunks), errors[bad[0]], self.decode_stats.as_dict(),
        )  # fmt: skip

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any], **kwargs: Any) -> torch.Tensor:
        """One action ``[B, D]`` per call; a new chunk is predicted every ``n_action_steps`` calls."""
        if not self._queue:
            chunk = self.predict_action_chunk(batch, **kwargs)[:, : self.config.n_action_steps]  # [B, n, D]
            self._queue.extend(chunk.transpose(0, 1))
        action = self._queue.popleft()
        self._previous_action = action
        return action

    # --- inputs -------------------------------------------------------------------------------------------
    def _observation(self, batch: dict[str, Any]) -> tuple[list[str], np.ndarray, torch.Tensor | None]:
        """Check an observation batch; return tasks, normalised states ``[B, S]`` and images ``[B, N, 3, H, W]``."""
        if not isinstance(batch, dict):
            raise ValueError(f"the batch must be a dict of tensors, got {type(batch).__name__}")
        state = _tensor(batch, STATE)
        if state.ndim == 1:
            state = state[None]
        s = self.config.state_dim
        if state.ndim != 2 or state.shape[1] != s:
            raise ValueError(
                f"batch['{STATE}'] has shape {tuple(state.shape)} but the policy was trained on a {s}-D state; "
                f"pass [B, {s}] (was the robot or the state key changed?)"
            )
        b = state.shape[0]
        tasks = batch.get("task")
        if tasks is None:
            raise ValueError(
                "the batch lacks 'task' (the instruction, a string per sample); add it, e.g. batch['task'] = ['push']"
            )
        if isinstance(tasks, str):
            tasks = [tasks] * b
        tasks = list(tasks)
        if len(tasks) != b:
            raise ValueError(f"batch['task'] holds {len(tasks)} strings for {b} states; pass one per sample")
        states = self.state_normalizer.normalize(state.detach().cpu().double().numpy())
        images = None
        if self.config.image_keys:
            size = self.model.image_size
            images = torch.stack([self._image(batch, key, b, size) for key in self.config.image_keys], dim=1)
        return tasks, states, images

    def _image(self, batch: dict[str, Any], key: str, b: int, size: int) -> torch.Tensor:
        """One camera as float ``[B, 3, size, size]`` in [0, 1] on the model's device."""
        if key not in batch:
            cams = [k for k in batch if str(k).startswith(IMAGE_PREFIX)]
            close = difflib.get_close_matches(key, cams, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"the observation lacks camera {key!r}, which the policy was trained with{hint} "
                f"(cameras present: {', '.join(cams) or 'none'})"
            )
        img = torch.as_tensor(batch[key])
        if img.ndim == 3:
            img = img[None]
        if img.ndim != 4 or img.shape[0] != b or img.shape[1] != 3:
            raise ValueError(f"batch['{key}'] has shape {tuple(img.shape)}; expected [B={b}, 3, H, W] (channels first)")
        img = img.to(self.model.device)
        img = img.float() / 255.0 if img.dtype == torch.uint8 else img.float()
        if img.shape[-2:] != (size, size):
            img = torch.nn.functional.interpolate(img, size=(size, size), mode="bilinear", antialias=True)
        return img

    # --- files --------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str | Path, *, state_dict: dict | None = None, **kwargs: Any) -> None:
        """Write the policy atomically (a temporary folder renamed into place); nothing needs pickle to load."""
        if kwargs.get("push_to_hub"):
            raise ValueError("push_to_hub is not supported (no network); save locally and upload the folder yourself")
        with atomic_directory(save_directory) as tmp:
            self.config._save_pretrained(tmp)
            if state_dict is None:
                save_model(self, str(tmp / WEIGHTS_FILE))
            else:
                from huggingface_hub import save_torch_state_dict

                total = sum(t.numel() * t.element_size() for t in state_dict.values())
                save_torch_state_dict(state_dict, str(tmp), max_shard_size=max(total, 1))
            write_json(tmp / BACKBONE_CONFIG_FILE, self.model.backbone.config.to_dict())
            self.action_tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
            self.action_normalizer.save(tmp / ACTION_NORMALIZER_FILE)
            self.state_normalizer.save(tmp / STATE_NORMALIZER_FILE)
            if isinstance(self.vocab.text, LocalTextTokenizer):
                self.vocab.text.save(tmp / TEXT_TOKENIZER_DIR)
            for pipeline in make_vla_pre_post_processors(self.config):  # so lerobot-eval can load this folder
                pipeline.save_pretrained(tmp)

    def _save_pretrained(self, save_directory: Path, state_dict: dict | None = None) -> None:
        self.save_pretrained(save_directory, state_dict=state_dict)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_name_or_path: str | Path,
        *,
        config: VLAConfig | None = None,
        strict: bool = True,
        **kwargs: Any,
    ) -> VLAPolicy:
        """Load a folder written by ``save_pretrained``: no network, no pickle. ``config`` overrides the saved one
        (LeRobot passes its parsed config here); the tokenizer, normalisers and weights always come from the folder.
        """
        path = Path(pretrained_name_or_path)
        if not (path / "config.json").is_file() or not (path / WEIGHTS_FILE).is_file():
            raise ValueError(
                f"{path} is not a saved VLA policy (config.json and {WEIGHTS_FILE} expected); pass the folder "
                "save_pretrained wrote (downloading from a hub is not supported)"
            )
        if config is None:
            config = PreTrainedConfig.from_pretrained(path)
            if not isinstance(config, VLAConfig):
                raise ValueError(f"{path / 'config.json'} is a {type(config).__name__}, not a VLAConfig")
        backbone_file = path / BACKBONE_CONFIG_FILE
        text_dir = path / TEXT_TOKENIZER_DIR
        policy = cls(
            config,
            action_tokenizer=at.load_tokenizer(path / TOKENIZER_DIR),
            action_normalizer=at.Normalizer.load(path / ACTION_NORMALIZER_FILE),
            state_normalizer=at.Normalizer.load(path / STATE_NORMALIZER_FILE),
            text_tokenizer_dir=text_dir if text_dir.is_dir() else None,
            backbone_config=json.loads(backbone_file.read_text()) if backbone_file.is_file() else None,
        )
        missing, unexpected = load_model(policy, str(path / WEIGHTS_FILE), strict=strict, device="cpu")
        if missing or unexpected:
            logger.warning("loading %s: missing keys %s, unexpected keys %s", path, missing, unexpected)
        policy.to(config.device)
        policy.eval()
        return policy


# --- construction from LeRobot's factory -----------------------------------------------------------------------
def _tokenizer_from_config(config: VLAConfig) -> at.ActionTokenizer:
    if config.action_tokenizer_path is None:
        raise ValueError(
            "no action tokenizer: pass action_tokenizer=... or set VLAConfig.action_tokenizer_path to a folder "
            "written by tok.save_pretrained (e.g. --policy.action_tokenizer_path=outputs/tok)"
        )
    return at.load_tokenizer(config.action_tokenizer_path)


def _from_stats(stats: dict[str, dict[str, Any]] | None, key: str, mode: str) -> at.Normalizer:
    if stats is None or key not in stats:
        raise ValueError(
            f"no normaliser for {key!r}: pass {'action' if key == ACTION else 'state'}_normalizer=at.Normalizer(...) "
            f"or dataset_stats holding {key!r} (LeRobot's factory passes the dataset's stats)"
        )
    entry = {k: np.asarray(torch.as_tensor(v).cpu(), dtype=np.float64) for k, v in stats[key].items()}
    if mode == "quantile" and {"q01", "q99", "min", "max"} <= entry.keys():
        # LeRobot 0.6 averages per-episode quantiles: a dimension that is constant within each episode but not
        # across them (a goal, an object's start) gets q01 == q99, and the policy cannot see it.
        collapsed = np.flatnonzero((entry["q99"] - entry["q01"] < 1e-8) & (entry["max"] - entry["min"] > 1e-6))
        if len(collapsed):
            logger.warning(
                "%s: dimensions %s vary (min < max) but their q01 == q99 in these stats, so quantile normalisation "
                "hides them. LeRobot's stats.json averages per-episode quantiles; normalise with exact ones "
                "(vla.data.frame_stats, as `vla train` does) or use the mean_std mode.", key, collapsed.tolist(),
            )  # fmt: skip
    return at.Normalizer.from_stats(entry, mode)


def _tensor(batch: dict[str, Any], key: str) -> torch.Tensor:
    if key not in batch:
        close = difflib.get_close_matches(key, [str(k) for k in batch], n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"the batch lacks {key!r}{hint} (keys: {', '.join(map(str, batch))})")
    value = batch[key]
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


def make_vla_pre_post_processors(config: VLAConfig, dataset_stats: dict | None = None):
    """LeRobot's processor pair for this policy: batch and move to the device in, back to the CPU out.

    No normalisation steps: the policy normalises with its own saved normalisers (``dataset_stats`` is unused).
    """
    from lerobot.processor.factory import make_default_policy_processor_steps, make_policy_processor_pipelines

    steps = make_default_policy_processor_steps(config, None)
    return make_policy_processor_pipelines(
        input_steps=[steps.rename_observations, steps.add_batch_dim, steps.to_device],
        output_steps=[steps.to_cpu],
    )


def lerobot_train() -> None:
    """``lerobot-train`` with this policy registered: ``--policy.type=vla --policy.action_tokenizer_path=...``."""
    from lerobot.scripts.lerobot_train import main

    main()


def lerobot_eval() -> None:
    """``lerobot-eval`` with this policy registered: ``--policy.path=<folder save_pretrained wrote>``."""
    from lerobot.scripts.lerobot_eval import main

    main()
