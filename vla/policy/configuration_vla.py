"""The policy's configuration: one dataclass, validated once, read by ``vla train`` (as ``policy:`` in a training
config), by LeRobot's trainer (``--policy.type=vla --policy.<field>=...``) and saved as the policy's ``config.json``.

Its defaults are the measured recipe for a model trained from scratch on CPU (the state as an embedding, 10-step
chunks of which 5 run, lr 3e-3 with 100 warm-up steps and a cosine decay over 3000): whichever trainer runs it
gets the configuration the README's figures were measured with. The optimiser and schedule are LeRobot's presets
(``get_optimizer_preset`` / ``get_scheduler_preset``), used by both trainers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from action_tokenizers.base import MAX_ACTION_DIM, MAX_TIME_HORIZON
from action_tokenizers.normalize import NORM_MODES
from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature, PreTrainedConfig
from lerobot.optim import AdamWConfig, CosineDecayWithWarmupSchedulerConfig
from lerobot.utils.constants import ACTION, OBS_IMAGE, OBS_STATE

from vla.data.reader import IMAGE_PREFIX
from vla.model.presets import PRESETS
from vla.model.sequence import ATTENTIONS, DECODINGS, STATE_ENCODINGS
from vla.model.vision import VISION_ENCODERS
from vla.names import suggestion
from vla.tokenizer_choice import parse_choice

DTYPES = ("float32", "bfloat16")
AUTO = "auto"  # a setting chosen from the dataset when `vla train` starts (vla.data.defaults)
# What decoding="auto" chooses, per tokenizer: one pass for binning, whose ids each spell one value of one step and
# dimension (push-v3 from a 64 px camera: results/push_pixels_bin; from the state: results/parallel, 100% against 34%),
# one id at a time for the others (FSQ's and BEAST's ids each carry a latent or a control point: one pass did a little
# worse, results/parallel; FAST's chunks vary in length).
ONE_PASS_TOKENIZERS = ("bin",)


def chosen_decoding(tokenizer: str) -> tuple[str, str]:
    """The decoding ``decoding="auto"`` chooses for the tokenizer named ``tokenizer``, and why."""
    if tokenizer in ONE_PASS_TOKENIZERS:
        return "parallel", (
            f"{tokenizer}'s ids each spell one value, predicted in one pass (push-v3 from a 64 px camera and from the "
            "state: results/push_pixels_bin, results/parallel)"
        )
    return "autoregressive", f"one id at a time: {tokenizer}'s ids depend on each other (results/parallel)"


RELATIVE_CHOICES = ("none", "auto")  # or a mask per action dimension
# Most action ids decoded per chunk: decoding reserves its cache for this many, so a larger value from a file would
# ask the allocator for gigabytes. The longest constrained chunk (binning, 50 steps x 14 dims) needs 700.
MAX_ACTION_TOKENS = 8192
MAX_COMMIT_SEARCH = 64  # chunks decoded per observation when searching for committed actions
# Upper bounds on every size a config (or a saved policy's config.json) sets: the model, its inputs or decoding are
# allocated by them, so a value beyond (1e9 from a damaged file) is refused with the bound, not met by the allocator.
SIZE_BOUNDS = {
    "time_horizon": MAX_TIME_HORIZON,
    "action_dim": MAX_ACTION_DIM,
    "max_action_tokens": MAX_ACTION_TOKENS,
    "state_dim": 1024,  # a state's dimensions
    "image_size": 1024,  # pixels per side (PaliGemma: 224 to 896)
    "max_prefix_len": 8192,  # text tokens in the prefix
    "state_bins": 1 << 16,  # text state encoding: integers per value
    "state_tokens": 64,  # embedding state encoding: prefix embeddings
    "n_obs_steps": 64,  # states read per observation
    "num_beams": 64,  # beam search hypotheses per observation
}


@PreTrainedConfig.register_subclass("vla")
@dataclass
class VLAConfig(PreTrainedConfig):
    """The policy's configuration. Every field can be set from LeRobot's CLI as ``--policy.<field>=...``."""

    push_to_hub: bool = False  # LeRobot's default is True; this project never reaches the network

    # --- backbone -----------------------------------------------------------------------------------------
    preset: str = "tiny"  # backbone size (vla.model.presets.PRESETS): "tiny" (CPU), "small", "paligemma-3b"
    backbone_path: str | None = None  # local PaliGemma checkpoint folder (weights + tokenizer.json), for "paligemma-3b"
    attn_implementation: str = "sdpa"  # transformers attention kernel: "sdpa" or "eager"
    dtype: str = "float32"  # weights: "float32" or "bfloat16" (GPU)
    init_seed: int | None = None  # seeds the random initial weights; None uses the global RNG
    # "siglip": PaliGemma's ViT, one token per patch; "keypoints": a small conv stem and a spatial softmax (Levine et
    # al. 2016), as many (x, y) keypoint tokens as SigLIP has patches (tiny: 16), the low-data recipe for small objects;
    # "conv": a conv stem, flattened, one linear layer (SAC-AE / DrQ), the one that learns to see from scratch here
    # "auto" (vla train with no config file): "conv" for cameras trained from scratch, "siglip" with backbone_path
    vision_encoder: str = "siglip"

    # --- shapes -------------------------------------------------------------------------------------------
    # T: actions per predicted chunk (openpi's action_horizon). None: from chunk_seconds and the dataset's fps, chosen
    # when `vla train` starts (vla.data.defaults; the default without a config file)
    time_horizon: int | None = 10
    # The chunk's length in seconds: when set, `vla train` sets time_horizon = round(chunk_seconds * fps) (it decides T
    # even where time_horizon is set too); None with time_horizon None: vla.data.defaults.CHUNK_SECONDS
    chunk_seconds: float | None = None
    # The delay the policy will be served behind (network round trip plus decode, ms): `vla train` makes the chunk long
    # enough that the actions run from it still cover the time the next one is on its way, T >= ceil(delay_ms * fps /
    # 1000) + n_action_steps (half the chunk when n_action_steps is unset: T >= twice the delay's steps). None: no delay
    delay_ms: float | None = None
    # Frames per second of the data the policy was trained on, recorded by `vla train` (and LeRobot's trainer): a chunk
    # of time_horizon steps means time_horizon / fps seconds. Fine-tuning on data at another rate is refused unless
    # this is set to that rate (--policy.fps=...). None: not recorded (policies saved before it was)
    fps: float | None = None
    # actions executed from each chunk before predicting the next (<= time_horizon); None: half the chunk (vla train)
    n_action_steps: int | None = 5
    # LeRobot's field, here Optional: the states the policy reads (1: the current one); None: chosen when `vla train`
    # starts (vla.data.defaults: 3 for a policy that reads a state and no camera, else 1)
    n_obs_steps: int | None = 1
    # n_obs_steps (LeRobot's field) > 1: the policy reads the last n states, as the current one and its changes since
    # each earlier frame, each change times state_delta_scale (per state dim; vla train fits it so one frame's
    # normalised change spans about [-1, 1]; None = 1)
    state_delta_scale: list[float] | None = None
    # ACT's temporal ensembling: predict every n_action_steps and run the weighted mean of every chunk covering the
    # step (weights exp(-coeff * i), oldest first; ACT uses 0.01); None = run each chunk's first n_action_steps
    temporal_ensemble: float | None = None
    action_dim: int | None = None  # D; None = from output_features, the tokenizer or the action normaliser
    state_dim: int | None = None  # S; None = from input_features or the state normaliser; 0 = no state (image-only)
    # cameras, "observation.images.<cam>"; empty = state + task; None = every camera of the dataset (vla train)
    image_keys: list[str] | None = field(default_factory=list)
    image_size: int | None = None  # images are resized to this square size; None = the preset's (tiny: 64)
    image_shift: int = 4  # training only: random shift of each image by up to this many pixels (DrQ); 0 = none

    # --- sequence -----------------------------------------------------------------------------------------
    max_prefix_len: int = 256  # most text tokens in the prefix (BOS + task + state); longer tasks are cut (logged)
    # "embedding": an MLP writes the state into the prefix (the CPU recipe); "text": pi0-FAST's integers in the prompt
    # (what a pretrained language model reads well: use it with paligemma-3b weights)
    state_encoding: str = "embedding"
    state_bins: int = 256  # text: the normalised state is written as integers in [0, state_bins)
    state_tokens: int = 1  # embedding: prefix embeddings the state encoder writes
    # Compact vocabulary only: words given one id each (vla.model.sequence.prompt_words: the template's and the tasks').
    # Training fills it from the dataset's tasks; other text is spelled in bytes. Empty = bytes and numbers only.
    text_words: list[str] = field(default_factory=list)
    max_action_tokens: int | None = None  # most action ids generated per chunk; None = the constraint's max_length
    # "prefix_lm": the observation prefix attends both ways, actions causally (pi0-FAST); "causal": a GPT's mask over
    # the whole sequence, prefix included (the ablation that asks why a prefix-LM)
    attention: str = "prefix_lm"

    # --- relative (delta) actions: openpi's DeltaActions --------------------------------------------------
    # Per action dimension, True = the model predicts action - state (the state's matching dimension, below) and the
    # state is added back on the way out, so decoded chunks are absolute. "none" = all absolute; "auto" = every
    # dimension whose matched state dimension tracks it (vla.data.defaults.TRACKS) but grippers (named *grip*, *claw*,
    # *finger*, *jaw*), fixed into a mask from the dataset when training starts.
    relative_actions: list[bool] | str = "none"
    # For each action dimension, the state dimension holding the same quantity (relative actions, and the held-out
    # report's hold-the-state baseline). None = matched when training starts (vla.data.defaults.match_state): by feature
    # name, else by values (the state dim each action dim tracks), else one to one when the dims are equal; stays None
    # when none matches: then give it, e.g. [0, 1, 2, 4, 5, 6] for piper_grape.
    action_state_dims: list[int] | None = None

    # --- decoding -----------------------------------------------------------------------------------------
    temperature: float = 0.0  # 0 = greedy; > 0 samples (openpi used 0.7 for bimanual tasks)
    top_p: float = 1.0  # nucleus sampling mass (with temperature > 0)
    # > 1: beam search, the most probable chunk among num_beams hypotheses per observation kept at every step (greedy's
    # generalisation: temperature 0, autoregressive decoding); 1 = greedy or sampling
    num_beams: int = 1
    # Committed actions (vla.execution.COMMITTED) with a tokenizer whose ids mix the chunk's steps (FAST, BEAST, FSQ),
    # which cannot force a chunk's first ids: the greedy chunk and commit_search - 1 chunks sampled at temperature 1,
    # the one whose first actions are nearest the committed ones sent (a search under the constraint; the samples
    # decoded as one batch of B * (commit_search - 1) rows). 0 refuses committed actions for such a policy. Time-local tokenizers (bin) force the ids instead
    commit_search: int = 8
    # Committed-prefix conditioning: > 0 trains the policy to read up to this many committed actions beside the state
    # (half the training chunks show none, the others their first d ~ U{1..n} actions, normalised, with a mask), so that a chunk
    # asked while actions run continues them (--commit behind a delay; more than n are cut to the first n). Needs the
    # state in the prefix as embeddings (state_encoding "embedding", a state). 0 = off: committed actions are forced
    # (bin) or searched for (commit_search)
    commit_condition: int = 0
    constrained: bool = True  # mask logits with the tokenizer's constraint (False only for ablations)
    use_kv_cache: bool = True  # prefill once and decode from the KV cache (False recomputes every step)
    # "autoregressive": one action id per forward pass (pi0-FAST); "parallel": one learned query slot per id of a
    # fixed-length chunk (bin, fsq, beast; not FAST), every slot predicted in one forward pass (results/parallel/);
    # "auto": chosen by the tokenizer when the policy is built (chosen_decoding; `vla train` without a config file)
    decoding: str = "autoregressive"

    # --- tokenizer and normalisation when LeRobot's factory builds the policy ------------------------------
    action_tokenizer_path: str | None = None  # folder written by tok.save_pretrained (used when none is passed)
    # With no path (and no tokenizer passed), LeRobot's trainer fits this one on the dataset's chunks, as `vla train`
    # does: a tokenizer choice as `vla compare` spells it, "fast", "bin:n_bins=128", "fsq", "beast:n_control_points=6"
    action_tokenizer_type: str = "fast"
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

    # --- optimiser and schedule: LeRobot's AdamW and cosine-with-warm-up presets, used by `vla train` too -------
    # The FAST paper's AdamW (0.9, 0.95), clipping at 1; a high lr for a small model trained from scratch (the
    # 3B fine-tuning recipe is 2.5e-5 to 5e-5 after 1000 warm-up steps: configs/paligemma-3b.yaml).
    optimizer_lr: float = 3e-3  # peak learning rate, reached after the warm-up
    optimizer_betas: tuple[float, float] = (0.9, 0.95)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.01
    optimizer_grad_clip_norm: float = 1.0  # max gradient norm
    scheduler_warmup_steps: int = 100  # linear warm-up from lr / (warmup + 1) to lr
    # cosine decay from lr (counted from step 0) to decay_lr; flat after. None: the run's steps (vla train)
    scheduler_decay_steps: int | None = 3000
    scheduler_decay_lr: float = 3e-4  # the learning rate at the end of the decay

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_model()
        self._check_optimizer()
        self._check_chunking()
        self._check_sizes()
        self._check_observation()
        self._check_actions()
        self._check_decoding()
        self.optimizer_betas = tuple(self.optimizer_betas)  # YAML gives a list

    def _check_model(self) -> None:
        """The backbone: its preset, weights, attention and dtype, and the vision encoder."""
        if self.preset not in PRESETS:
            raise ValueError(
                f"preset {self.preset!r} is unknown{suggestion(self.preset, PRESETS, 0.4)}; "
                f"choose one of {', '.join(PRESETS)}"
            )
        if self.backbone_path is not None and self.preset != "paligemma-3b":
            raise ValueError(f"backbone_path is set but preset is {self.preset!r}; set preset='paligemma-3b'")
        _check(
            self.attn_implementation in ("sdpa", "eager"),
            "attn_implementation",
            self.attn_implementation,
            "use 'sdpa' or 'eager'",
        )
        _check(self.dtype in DTYPES, "dtype", self.dtype, f"use one of {', '.join(DTYPES)}")
        close = suggestion(self.vision_encoder, VISION_ENCODERS)
        _check(
            self.vision_encoder in (*VISION_ENCODERS, AUTO),
            "vision_encoder",
            self.vision_encoder,
            f"use one of {', '.join(VISION_ENCODERS)} or {AUTO!r} (chosen when training starts){close}",
        )

    def _check_optimizer(self) -> None:
        """LeRobot's optimiser and schedule presets."""
        _check(self.optimizer_lr > 0, "optimizer_lr", self.optimizer_lr, "use a positive learning rate (3e-3 for tiny)")
        _check(
            self.optimizer_grad_clip_norm > 0,
            "optimizer_grad_clip_norm",
            self.optimizer_grad_clip_norm,
            "use a positive norm (1.0 is the FAST paper's)",
        )
        _check(
            len(self.optimizer_betas) == 2 and all(0 <= b < 1 for b in self.optimizer_betas),
            "optimizer_betas",
            self.optimizer_betas,
            "use two numbers in [0, 1), e.g. (0.9, 0.95)",
        )
        _check(self.scheduler_warmup_steps >= 0, "scheduler_warmup_steps", self.scheduler_warmup_steps, "use >= 0")
        _check(
            self.scheduler_decay_steps is None or self.scheduler_decay_steps >= 1,
            "scheduler_decay_steps",
            self.scheduler_decay_steps,
            "use >= 1, or None (the run's steps)",
        )
        _check(
            0 <= self.scheduler_decay_lr <= self.optimizer_lr,
            "scheduler_decay_lr",
            self.scheduler_decay_lr,
            f"use a value in [0, optimizer_lr = {self.optimizer_lr}]",
        )

    def _check_chunking(self) -> None:
        """The chunk: its length, how much of it runs, the states shown and the ensemble."""
        _check(
            self.time_horizon is None or self.time_horizon >= 1,
            "time_horizon",
            self.time_horizon,
            "use a positive number of steps, or None (from chunk_seconds and the dataset's fps)",
        )
        _check(
            self.delay_ms is None or 0 <= self.delay_ms <= 60_000,
            "delay_ms",
            self.delay_ms,
            "use the round trip plus decode in milliseconds, 0..60000, or None (no delay)",
        )
        _check(
            self.chunk_seconds is None or 0 < self.chunk_seconds < float("inf"),
            "chunk_seconds",
            self.chunk_seconds,
            "use a positive number of seconds, e.g. 0.5, or None",
        )
        # T is decided when training starts where chunk_seconds or a delay is set (vla.data.defaults): bound it then
        decided_later = self.chunk_seconds is not None or bool(self.delay_ms) or self.time_horizon is None
        _check(
            self.n_action_steps is None
            or 1 <= self.n_action_steps <= (self.n_action_steps if decided_later else self.time_horizon),
            "n_action_steps",
            self.n_action_steps,
            f"use 1 <= n_action_steps <= time_horizon ({self.time_horizon}), or None (half the chunk)",
        )
        _check(
            self.n_obs_steps is None or self.n_obs_steps >= 1,
            "n_obs_steps",
            self.n_obs_steps,
            "use 1 (the current state) or n > 1 (the last n states, oldest first: a velocity cue)",
        )
        _check(
            self.temporal_ensemble is None or 0 <= self.temporal_ensemble < float("inf"),
            "temporal_ensemble",
            self.temporal_ensemble,
            "use a coefficient >= 0 (ACT's 0.01) or None (no ensembling)",
        )

    def _check_sizes(self) -> None:
        """Sizes: positive where set, and within ``SIZE_BOUNDS``; the data's fps and state size."""
        for name in ("action_dim", "image_size", "max_action_tokens"):
            value = getattr(self, name)
            _check(value is None or value >= 1, name, value, "use a positive integer or leave it unset (None)")
        for name, bound in SIZE_BOUNDS.items():
            value = getattr(self, name)
            big = isinstance(value, (int, float)) and not isinstance(value, bool) and value > bound
            _check(not big, name, value, f"use at most {bound} (its bound in SIZE_BOUNDS)")
        fps_ok = self.fps is None or 0 < self.fps < float("inf")
        _check(fps_ok, "fps", self.fps, "use the data's frames per second, e.g. 10, or None (not recorded)")
        _check(
            self.state_dim is None or self.state_dim >= 0,
            "state_dim",
            self.state_dim,
            "use a positive integer, 0 (no state: an image-only policy) or leave it unset (None: from the data)",
        )

    def _check_observation(self) -> None:
        """The cameras, the prompt and how the state is written into it."""
        _check(self.image_shift >= 0, "image_shift", self.image_shift, "use 0 (no shift) or a few pixels, e.g. 4")
        # observation.images.<cam>, or LeRobot's one-camera key observation.image (its Meta-World env's)
        keys = self.image_keys or []
        bad = [k for k in keys if not k.startswith(IMAGE_PREFIX) and k != OBS_IMAGE or k == IMAGE_PREFIX]
        _check(
            not bad, "image_keys", bad, f"name cameras by their full key, e.g. '{IMAGE_PREFIX}front' or '{OBS_IMAGE}'"
        )
        _check(len(set(keys)) == len(keys), "image_keys", self.image_keys, "list each camera once")
        _check(self.max_prefix_len >= 16, "max_prefix_len", self.max_prefix_len, "use at least 16 (256 is typical)")
        _check(self.state_bins >= 2, "state_bins", self.state_bins, "use at least 2 (256 is openpi's)")
        _check(
            self.state_encoding in STATE_ENCODINGS,
            "state_encoding",
            self.state_encoding,
            f"use one of {', '.join(STATE_ENCODINGS)}",
        )
        _check(self.attention in ATTENTIONS, "attention", self.attention, f"use one of {', '.join(ATTENTIONS)}")
        _check(
            self.decoding in (*DECODINGS, AUTO),
            "decoding",
            self.decoding,
            f"use one of {', '.join(DECODINGS)} or {AUTO!r} (chosen by the tokenizer: one pass for binning)",
        )

    def _check_actions(self) -> None:
        """Relative actions and the action dimensions they are relative to."""
        if isinstance(self.relative_actions, str):
            _check(
                self.relative_actions in RELATIVE_CHOICES,
                "relative_actions",
                self.relative_actions,
                "use 'none', 'auto' (all but grippers) or a mask per action dimension, e.g. [true, true, false]",
            )
        else:
            self.relative_actions = [bool(m) for m in self.relative_actions]
            _check(
                self.action_dim is None or len(self.relative_actions) == self.action_dim,
                "relative_actions",
                self.relative_actions,
                f"give one entry per action dimension ({self.action_dim})",
            )
        if self.state_dim == 0:  # relative actions are relative to the state
            mask = self.relative_actions
            relative = mask == "auto" or isinstance(mask, list) and any(mask)
            _check(
                not relative,
                "relative_actions",
                self.relative_actions,
                "actions can be relative to the state only, and state_dim = 0 (no state): use 'none'",
            )
        if self.action_state_dims is not None:
            _check(
                self.action_dim is None or len(self.action_state_dims) == self.action_dim,
                "action_state_dims",
                self.action_state_dims,
                f"give one state dimension per action dimension ({self.action_dim})",
            )
            _check(
                self.state_dim is None or all(0 <= i < self.state_dim for i in self.action_state_dims),
                "action_state_dims",
                self.action_state_dims,
                f"use state dimensions in [0, {self.state_dim})",
            )

    def _check_decoding(self) -> None:
        """Decoding (sampling, beams), the tokenizer's spelling and the normalisers."""
        _check(self.state_tokens >= 1, "state_tokens", self.state_tokens, "use a positive number (1 is typical)")
        _check(self.temperature >= 0, "temperature", self.temperature, "use 0 for greedy or a positive value")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "use a value in (0, 1]")
        _check(
            0 <= self.commit_search <= MAX_COMMIT_SEARCH,
            "commit_search",
            self.commit_search,
            f"use 0 (refuse committed actions) .. {MAX_COMMIT_SEARCH} chunks decoded per observation",
        )
        _check(
            self.commit_condition >= 0 and (self.commit_condition == 0 or self.state_encoding == "embedding"),
            "commit_condition",
            self.commit_condition,
            "use 0 (off) or a number of actions >= 1 with state_encoding='embedding' (the committed actions are read "
            "beside the state)",
        )
        self.check_num_beams(self.num_beams)
        try:
            parse_choice(self.action_tokenizer_type)
        except ValueError as err:
            _check(
                False,
                "action_tokenizer_type",
                self.action_tokenizer_type,
                f"{err}; write name[:option=value,...], e.g. 'bin:n_bins=128'",
            )
        for name in ("action_norm_mode", "state_norm_mode"):
            mode = getattr(self, name)
            _check(mode in NORM_MODES, name, mode, f"use one of {', '.join(NORM_MODES)}")

    def check_num_beams(self, num_beams: Any) -> None:
        """Raise unless ``num_beams`` suits this policy (a positive integer; > 1 only for greedy autoregressive)."""
        _check(
            isinstance(num_beams, int) and num_beams >= 1,
            "num_beams",
            num_beams,
            "use 1 (greedy or sampling) or more hypotheses for beam search, e.g. 4",
        )
        _check(  # "auto" is checked again once the tokenizer has chosen (VLAPolicy)
            num_beams == 1 or self.temperature == 0 and self.decoding in ("autoregressive", AUTO),
            "num_beams",
            num_beams,
            f"beam search keeps the most probable chunks, so it needs temperature 0 and decoding='autoregressive' "
            f"(this policy: {self.temperature}, {self.decoding!r}); use num_beams=1, or temperature=0 and "
            "decoding='autoregressive'",
        )

    def relative_mask(self) -> tuple[bool, ...] | None:
        """The resolved mask of relative dimensions, or None when every dimension is absolute."""
        if self.relative_actions == "none" or (
            isinstance(self.relative_actions, list) and not any(self.relative_actions)
        ):
            return None
        if self.relative_actions == "auto":
            raise ValueError(
                "VLAConfig.relative_actions = 'auto' is resolved from the dataset's action names when "
                "training starts; give the mask itself here, e.g. [true, true, false]"
            )
        if self.action_state_dims is None:
            raise ValueError(
                "relative actions need VLAConfig.action_state_dims: the state dimension of each action "
                "dimension (the dataset's names or dims did not match; e.g. [0, 1, 2, 4, 5, 6])"
            )
        return tuple(self.relative_actions)

    # --- what LeRobot asks of a policy config ---------------------------------------------------------------
    def unresolved(self) -> list[str]:
        """The settings left to be chosen from a dataset (None or "auto"); `vla train` fixes them (vla.data.defaults)."""
        names = ("time_horizon", "n_action_steps", "n_obs_steps", "image_keys", "scheduler_decay_steps")
        return [n for n in names if getattr(self, n) is None] + [
            n for n in ("vision_encoder", "relative_actions") if getattr(self, n) == AUTO
        ]

    def check_resolved(self, *names: str) -> None:
        """Raise unless the settings ``names`` (all when none) are fixed: LeRobot's trainer does not choose them."""
        left = [n for n in self.unresolved() if not names or n in names]
        if left:
            raise ValueError(
                f"VLAConfig.{left[0]} = {getattr(self, left[0])!r} is chosen from the dataset when "
                "`vla train` starts; give a value here (e.g. --policy.time_horizon=10 "
                "--policy.n_action_steps=5 --policy.n_obs_steps=1)"
            )

    @property
    def observation_delta_indices(self) -> list[int] | None:
        # n_obs_steps > 1: the last n frames (LeRobot then stacks every observation key; cameras keep their last)
        self.check_resolved("n_obs_steps")
        return list(range(1 - self.n_obs_steps, 1)) if self.n_obs_steps > 1 else None

    @property
    def action_delta_indices(self) -> list[int]:
        self.check_resolved("time_horizon")
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
        if self.state_dim != 0:  # 0: no state, whether or not the data has one
            self._reconcile_dim(self.input_features, OBS_STATE, FeatureType.STATE, "state_dim")
        self._reconcile_dim(self.output_features, ACTION, FeatureType.ACTION, "action_dim")
        visual = [k for k, ft in self.input_features.items() if ft.type is FeatureType.VISUAL]
        for key in self.image_keys or []:
            if key in self.input_features:
                continue
            if visual:  # the data names its cameras: an unknown one is a typo, not a new camera
                raise ValueError(
                    f"image_keys has {key!r}, which the data lacks{suggestion(key, visual)} "
                    f"(cameras: {', '.join(visual)})"
                )
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
