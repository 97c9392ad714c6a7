"""The policy: a LeRobot ``PreTrainedPolicy`` that owns the prefix-LM, the action tokenizer, the normalisers and
the data pipeline (``vla.policy.pipeline``) built from them.

    policy = VLAPolicy(VLAConfig(time_horizon=10, n_action_steps=5, image_keys=["observation.images.corner2"]),
                       action_tokenizer=tok, action_normalizer=a_norm, state_normalizer=s_norm)
    loss, metrics = policy.forward(batch)            # a packed batch (policy.pipeline's Collate) or a raw one
    chunk = policy.predict_action_chunk(obs)         # [B, T, D] raw units
    action = policy.select_action(obs)               # [B, D], from a queue refilled every n_action_steps
    policy.save_pretrained("ckpt/"); policy = VLAPolicy.from_pretrained("ckpt/")

``vla train`` packs batches in its DataLoader workers with ``policy.pipeline``'s training steps, so ``forward``
only moves tensors and computes the loss; a raw LeRobot batch (``observation.state``, cameras, ``task``,
``action`` [B, T, D]; LeRobot's own trainer) runs the same steps here first.

An invalid decode (possible only with ``constrained=False``) never passes silently: the row falls back to repeating
the previously executed action (or the normalised zero action, i.e. the middle of the data's range, before any
action was executed), is counted in ``policy.decode_stats`` and logged.

Saved files (``save_pretrained``, written to a temporary folder and renamed into place):
    config.json              the VLAConfig (LeRobot's format, with "type": "vla")
    model.safetensors        the weights
    backbone_config.json     the exact PaliGemmaConfig, so loading never depends on preset definitions
    action_tokenizer/        tok.save_pretrained
    action_normalizer.json, state_normalizer.json   (no state normaliser for a policy without state, state_dim 0)
    text_tokenizer/          only for the PaliGemma vocabulary (a copy of the Gemma tokenizer.json)
    policy_{pre,post}processor.json   LeRobot's processor pipelines (vla.policy.processor_vla: batch and device
                                      only; the policy normalises), for lerobot-eval and lerobot-rollout
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import action_tokenizers as at
import numpy as np
import torch
from action_tokenizers.io import check_tensor_kinds
from lerobot.policies.pretrained import PreTrainedPolicy
from lerobot.utils.constants import ACTION, OBS_STATE
from safetensors.torch import load_model, save_model

from vla.data import reader
from vla.execution import COMMITTED, StateHistory, executor
from vla.io import atomic_directory, read_json, write_json
from vla.model.decode import Generation, generate
from vla.model.prefix_lm import build_model
from vla.model.sequence import SequenceLayout
from vla.model.text import TEXT_TOKENIZER_DIR, LocalTextTokenizer
from vla.model.vocab import PALIGEMMA_TEXT_VOCAB, VocabMap
from vla.model.vocab_constraint import VocabConstraint, fixed_chunk_length
from vla.policy.commit_search import (
    REFUSES_COMMITTED,
    SEARCH_TEMPERATURE,
    checked_committed,
    nearest_to_committed,
    tiled,
)
from vla.policy.configuration_vla import AUTO, VLAConfig, chosen_decoding
from vla.policy.decode_info import DecodeInfo, DecodeStats
from vla.policy.fitting import data_normalizers, normalizer_from_stats, policy_tokenizer, predicted_chunks
from vla.policy.pipeline import ACTION_IDS, FORCED_IDS, IMAGES, SEQUENCE, Pipeline, packed, run
from vla.policy.processor_vla import check_processor_files, make_vla_pre_post_processors
from vla.policy.saved_config import CONFIG_FILE, check_dataset_fits, check_same_policy, load_policy_config

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
BACKBONE_CONFIG_FILE = "backbone_config.json"
TOKENIZER_DIR = "action_tokenizer"
ACTION_NORMALIZER_FILE = "action_normalizer.json"
STATE_NORMALIZER_FILE = "state_normalizer.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MANIFEST_FILE = "vla_policy.json"  # {"format_version": ...}: checked on every load
FORMAT_VERSION = 1


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
        dataset_meta: Any = None,  # LeRobot's factory: the dataset, to fit a tokenizer on when no path is given
    ):
        super().__init__(config)
        self._set_parts(action_tokenizer, action_normalizer, state_normalizer, dataset_stats, dataset_meta)
        self._settle_config()
        constraint = self.action_tokenizer.constraint(time_horizon=config.time_horizon, action_dim=config.action_dim)
        slots = self._query_slots(constraint)
        self.vocab = self._vocabulary(text_tokenizer_dir)
        if backbone_config is not None:  # a saved policy: its embedding table was sized for the tokenizer it saved
            self._check_vocab_rows(backbone_config)
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
            # a history's frames side by side, then the committed actions shown beside them (commit_condition)
            state_dim=config.state_dim * config.n_obs_steps + config.commit_condition * (config.action_dim + 1),
            state_tokens=config.state_tokens if config.state_encoding == "embedding" and config.state_dim else 0,
            query_slots=slots,
            vision_encoder=config.vision_encoder,
        )
        self.layout = SequenceLayout(
            self.vocab,
            image_tokens=self.model.image_tokens,
            num_cameras=len(config.image_keys),
            max_prefix_len=config.max_prefix_len,
            state_bins=config.state_bins,
            state_encoding=config.state_encoding,
            state_tokens=config.state_tokens,
            attention=config.attention,
            decoding=config.decoding,
            num_slots=slots,
        )
        self.constraint = VocabConstraint(constraint, self.vocab)
        self.max_new_tokens = (config.max_action_tokens or self.constraint.max_length) + 1  # + "|"
        if config.constrained and self.max_new_tokens < self.constraint.max_length + 1:
            raise ValueError(
                f"VLAConfig.max_action_tokens = {config.max_action_tokens} can cut constrained chunks (they need up "
                f"to {self.constraint.max_length} ids); raise it or leave it unset"
            )
        self.pipeline = self._pipeline()
        self.decode_stats = DecodeStats()
        self.last_decode_info: DecodeInfo | None = None
        self.reset()  # the executor (chunks -> one action per call) and the state history of select_action
        self._previous_action: torch.Tensor | None = None  # [B, D] raw, the last action select_action returned

    def _set_parts(self, action_tokenizer, action_normalizer, state_normalizer, dataset_stats, dataset_meta) -> None:
        """The tokenizer and normalisers as given; else, when LeRobot's trainer passes its dataset (``dataset_meta``),
        both from the dataset as ``vla train`` computes them (``vla.policy.fitting``), and the data's fps recorded;
        else the normalisers from ``dataset_stats``. With none of these (LeRobot's ``policy_cls(config)``) no
        normalisers: the policy is built, saved and loaded, and refuses to act (``WITHOUT_STATS``)."""
        config = self.config
        # No state (an image-only policy): state_dim 0, or LeRobot's features naming no state (a dataset without one).
        features = config.input_features
        if config.state_dim is None and state_normalizer is None and features and OBS_STATE not in features:
            config.state_dim = 0
        root = getattr(dataset_meta, "root", None)
        data = None
        wants_state = config.state_dim != 0 and state_normalizer is None
        if root is not None and (action_normalizer is None or wants_state or action_tokenizer is None):
            info = reader.dataset_info(root)
            data = info, predicted_chunks(info, config, None)  # every episode: LeRobot's trainer trains on them all
        if data is not None and (action_normalizer is None or wants_state):
            found_action, found_state = data_normalizers(info, config, data[1], None)
            action_normalizer = action_normalizer or found_action
            state_normalizer = state_normalizer or found_state  # one given wins
        elif dataset_stats is not None:
            if action_normalizer is None:
                action_normalizer = normalizer_from_stats(dataset_stats, ACTION, config.action_norm_mode)
            if wants_state:
                state_normalizer = normalizer_from_stats(dataset_stats, OBS_STATE, config.state_norm_mode)
        if config.state_dim == 0 or action_normalizer is None:
            state_normalizer = None
        elif state_normalizer is None and (config.state_dim or OBS_STATE in (features or {})):
            raise ValueError(  # read raw, the state would be far outside the range the policy trained on
                f"no normaliser for {OBS_STATE!r}: the policy reads a state and was given an action normaliser only; "
                "pass state_normalizer=at.Normalizer(...) fitted on the same data, dataset_stats holding "
                f"{OBS_STATE!r}, or state_dim=0 for a policy without state"
            )
        if action_tokenizer is None:
            action_tokenizer = policy_tokenizer(config, data, action_normalizer)
        if config.fps is None and getattr(dataset_meta, "fps", None):  # LeRobot's trainer: the data's rate, recorded
            config.fps = float(dataset_meta.fps)
        self.action_tokenizer = action_tokenizer
        self.action_normalizer = action_normalizer
        self.state_normalizer = state_normalizer

    def _settle_config(self) -> None:
        """What the config leaves to the parts, filled from them (the decoding ``auto`` chooses, the dimensions), and
        the settings only the parts can check."""
        config = self.config
        if config.decoding == AUTO:  # chosen by the tokenizer (vla train chose and said it already)
            config.decoding = chosen_decoding(self.action_tokenizer.name)[0]
            config.check_num_beams(config.num_beams)
        self._resolve_dims()
        scale = config.state_delta_scale
        if scale is not None and len(scale) != config.state_dim:
            raise ValueError(
                f"VLAConfig.state_delta_scale has {len(scale)} values for a {config.state_dim}-D state; "
                "give one per state dim or None (vla train fits it)"
            )
        config.validate_features()
        if config.commit_condition > config.time_horizon:
            raise ValueError(
                f"VLAConfig.commit_condition = {config.commit_condition} is more actions than a chunk's "
                f"{config.time_horizon}: use at most time_horizon"
            )
        if config.commit_condition and not config.state_dim:
            raise ValueError(
                f"VLAConfig.commit_condition = {config.commit_condition} shows committed actions beside the state, "
                "but this policy reads no state (state_dim 0); use commit_condition=0 (committed actions are then "
                "forced or searched for)"
            )

    def _query_slots(self, constraint) -> int:
        """Parallel decoding's query slots, one per id (the chunk's length must be known before decoding); 0 for
        autoregressive decoding."""
        if self.config.decoding != "parallel":
            return 0
        slots = fixed_chunk_length(constraint)
        if slots is None:
            raise ValueError(
                f"VLAConfig.decoding = 'parallel' needs a tokenizer with a fixed number of ids per chunk (bin, "
                f"fsq, beast), but the {self.action_tokenizer.name!r} tokenizer's chunks vary in length; use "
                "decoding='autoregressive' with it, or a fixed-length tokenizer"
            )
        return slots

    def _vocabulary(self, text_tokenizer_dir: str | Path | None) -> VocabMap:
        """The vocabulary: compact (bytes + actions) or PaliGemma's own, read from a local folder."""
        text_dir = text_tokenizer_dir or self.config.backbone_path
        if text_dir is None:
            return VocabMap.compact(self.action_tokenizer.vocab_size, words=self.config.text_words)
        text = LocalTextTokenizer(text_dir, size=PALIGEMMA_TEXT_VOCAB)
        return VocabMap.paligemma(text, self.action_tokenizer.vocab_size)

    def _pipeline(self) -> Pipeline:
        """The data flow, both directions, built once from the parts (``vla.policy.pipeline``)."""
        config = self.config
        return Pipeline.build(
            tokenizer=self.action_tokenizer,
            state_normalizer=self.state_normalizer,
            action_normalizer=self.action_normalizer,
            layout=self.layout,
            state_dim=config.state_dim,
            time_horizon=config.time_horizon,
            action_dim=config.action_dim,
            image_keys=config.image_keys,
            image_size=self.model.image_size,
            image_shift=config.image_shift,
            relative_actions=config.relative_mask(),
            action_state_dims=config.action_state_dims,
            obs_steps=config.n_obs_steps,
            state_delta_scale=config.state_delta_scale,
            commit_condition=config.commit_condition,
        )

    def _check_vocab_rows(self, backbone_config: Any) -> None:
        """Refuse a tokenizer whose vocabulary is not the one the saved embedding table was sized for (compact
        vocabulary: the table holds exactly the text ids and the action ids): its ids would land on other rows."""
        text = backbone_config.get("text_config", {}) if isinstance(backbone_config, dict) else None
        rows = text.get("vocab_size") if text is not None else backbone_config.text_config.vocab_size
        if self.vocab.layout != "compact" or rows is None or rows == self.vocab.model_vocab_size:
            return
        held = rows - self.vocab.action_base
        raise ValueError(
            f"the policy's embedding table holds {held} action ids but its {self.action_tokenizer.name} action "
            f"tokenizer has {self.action_tokenizer.vocab_size}: it is not the tokenizer the policy was trained with. "
            f"Load the policy with the tokenizer it was saved with ({TOKENIZER_DIR}/ as save_pretrained wrote it), or "
            "train a new policy with this tokenizer (vla train without --policy.path)"
        )

    def _resolve_dims(self) -> None:
        """Fill action_dim / state_dim from whatever knows them, and check everything agrees."""
        c, tok = self.config, self.action_tokenizer
        features = {**(c.input_features or {}), **(c.output_features or {})}
        d_sources = {
            "config": c.action_dim,
            "action tokenizer": tok.action_dim,
            "action normaliser": getattr(self.action_normalizer, "dim", None),
            "output features": features[ACTION].shape[-1] if ACTION in features else None,
        }
        s_sources = {
            "config": c.state_dim,
            "state normaliser": getattr(self.state_normalizer, "dim", None),
            "input features": features[OBS_STATE].shape[-1] if OBS_STATE in features else None,
        }
        for name, sources in (("action_dim", d_sources), ("state_dim", s_sources)):
            known = {k: int(v) for k, v in sources.items() if v is not None}
            if len(set(known.values())) > 1:
                raise ValueError(f"{name} disagrees: {known}; fit the tokenizer and normalisers on the same data")
            setattr(c, name, next(iter(known.values())))
        if c.n_action_steps is not None and not 1 <= c.n_action_steps <= c.time_horizon:  # T is final here
            raise ValueError(
                f"VLAConfig.n_action_steps = {c.n_action_steps} is invalid: use 1 <= n_action_steps <= time_horizon "
                f"({c.time_horizon})"
            )
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
        self._actions = executor(self.config.n_action_steps, self.config.temporal_ensemble)  # the config as it is now
        self._history = StateHistory(self.config.n_obs_steps)  # select_action's states, n_obs_steps > 1
        self._previous_action = None

    def forward(self, batch: dict[str, Any], compiled: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training loss: cross-entropy on the action segment only. ``batch`` is packed (``policy.pipeline``'s
        ``Collate``: ``sequence``, ``images``) or raw (LeRobot's: the pipeline's training steps run here first).
        ``compiled``: the layers through torch.compile (``PrefixLM.loss``). Metrics are 0-d tensors, so nothing waits
        for the device here; the trainer reads them when it logs."""
        if SEQUENCE not in batch:  # augmentation (random image shifts) only while training
            batch = packed(run(self.pipeline.training if self.training else self.pipeline.measuring, batch))
        loss, metrics = self.model.loss(batch[SEQUENCE], batch.get(IMAGES), compiled=compiled)
        for key in ("tokens_per_chunk", "action_pad_fraction"):
            if key in batch:
                metrics[key] = torch.as_tensor(batch[key]).float()
        return loss, metrics

    @property
    def commit_scheme(self) -> str | None:
        """How the policy decodes after committed actions (``vla.execution.COMMITTED``): ``"conditioned"`` (trained
        to read them beside the state: ``config.commit_condition``), ``"forced"`` (its tokenizer's ids are time-local:
        the chunk begins with their ids), ``"search"`` (the decoded chunk nearest them, of ``config.commit_search``),
        None (refused: ``commit_search`` is 0)."""
        if self.config.commit_condition:
            return "conditioned"
        if self.action_tokenizer.time_local:
            return "forced"
        return "search" if self.config.commit_search > 0 else None

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, Any], generator: torch.Generator | None = None, **_: Any
    ) -> torch.Tensor:
        """Action chunks ``[B, T, D]`` in raw units for a batch of raw observations (``generator``: for sampling).
        With committed actions (``COMMITTED``) the chunks begin with them (``commit_scheme``)."""
        start = time.perf_counter()
        prompt = run(self.pipeline.prompt, batch)
        gen, out = self._decoded(prompt, batch, self.config.temperature, generator)
        searched = self.commit_scheme in ("search", None)  # None: _search refuses, saying why
        if COMMITTED in batch and searched and any(len(c) for c in batch[COMMITTED]):
            gen, out = self._search(batch, gen, out, generator)
        chunks = torch.as_tensor(np.where(np.isfinite(out[ACTION]), out[ACTION], 0.0), dtype=torch.float32)
        self.decode_stats.chunks += len(chunks)
        self._fall_back(chunks, out["valid"], out["errors"], batch)
        self.decode_stats.tokens += int(gen.tokens_per_chunk[out["valid"]].sum())
        self.last_decode_info = DecodeInfo(
            valid=out["valid"],
            tokens_per_chunk=gen.tokens_per_chunk,
            errors=out["errors"],
            latency_ms=(time.perf_counter() - start) * 1000,
            steps=gen.steps,
        )
        tensors = (batch.get(k) for k in (OBS_STATE, *self.config.image_keys))  # where the batch lives
        like = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
        return chunks.to(like.device) if like is not None else chunks

    def _decoded(
        self,
        prompt: dict[str, Any],
        batch: dict[str, Any],
        temperature: float,
        generator,
        num_beams: int | None = None,
    ) -> tuple[Generation, dict[str, Any]]:
        """One decode of the prompt: the generation, and its chunks (``ACTION``: float32 ``[B, T, D]`` raw, NaN or inf
        where invalid) with ``valid`` and ``errors`` (a chunk past float32 once unnormalised is invalid)."""
        gen = generate(
            self.model,
            prompt[SEQUENCE],
            vocab=self.vocab,
            constraint=self.constraint if self.config.constrained else None,
            images=prompt.get(IMAGES),
            max_new_tokens=self.max_new_tokens,
            temperature=temperature,
            top_p=self.config.top_p,
            num_beams=self.config.num_beams if num_beams is None else num_beams,
            use_cache=self.config.use_kv_cache,
            generator=generator,
            forced=prompt.get(FORCED_IDS),
        )
        raw_state = {OBS_STATE: batch[OBS_STATE]} if OBS_STATE in batch else {}  # for relative actions
        out = run(
            self.pipeline.outputs,
            {ACTION_IDS: gen.ids, "valid": gen.valid, "errors": gen.errors, **raw_state},
        )
        with np.errstate(over="ignore", invalid="ignore"):
            raw = np.asarray(out[ACTION], dtype=np.float32)  # [B, T, D] raw; beyond float32's range: inf
        finite = np.isfinite(raw).all(axis=(1, 2))
        overflow = np.flatnonzero(out["valid"] & ~finite)  # decoded, but unnormalised past float32: never sent
        out = {**out, ACTION: raw, "valid": out["valid"] & finite, "errors": list(out["errors"])}
        for i in overflow:
            out["errors"][i] = "the chunk is not finite once unnormalised (the action normaliser's scale or offset)"
        return gen, out

    def _search(self, batch, gen: Generation, out: dict[str, Any], generator) -> tuple[Generation, dict]:
        """The greedy chunk and ``commit_search - 1`` sampled ones (temperature 1, seeded by ``generator`` or 0, the
        samples decoded as one batch of ``B * (commit_search - 1)`` rows): per row, the valid one whose first actions
        are nearest the committed ones (``vla.policy.commit_search``)."""
        if self.commit_scheme is None:
            raise ValueError(REFUSES_COMMITTED.format(name=self.action_tokenizer.name))
        committed = checked_committed(batch[COMMITTED], self.config.action_dim, self.config.time_horizon)
        candidates, rows = [(gen.ids, out)], len(gen.ids)
        steps = gen.steps  # the forward passes the search cost
        if self.config.commit_search > 1:
            many = tiled(batch, self.config.commit_search - 1)
            seeded = generator or torch.Generator(device=self.model.device).manual_seed(0)
            g, o = self._decoded(run(self.pipeline.prompt, many), many, SEARCH_TEMPERATURE, seeded, num_beams=1)
            steps += g.steps
            for at_ in range(0, len(g.ids), rows):
                part = slice(at_, at_ + rows)
                candidates.append(
                    (g.ids[part], {ACTION: o[ACTION][part], "valid": o["valid"][part], "errors": o["errors"][part]})
                )
        scale = np.atleast_1d(self.action_normalizer.scale)
        pick = nearest_to_committed(
            [c[1][ACTION] for c in candidates], [c[1]["valid"] for c in candidates], committed, scale
        )
        index = list(enumerate(pick))
        chosen = {
            ACTION: np.stack([candidates[k][1][ACTION][r] for r, k in index]),
            "valid": np.array([candidates[k][1]["valid"][r] for r, k in index]),
            "errors": [candidates[k][1]["errors"][r] for r, k in index],
        }
        return dataclasses.replace(gen, ids=[candidates[k][0][r] for r, k in index], steps=steps), chosen

    def _fall_back(self, chunks: torch.Tensor, valid: np.ndarray, errors: list[str | None], batch) -> None:
        """Replace invalid chunks in place: previous action repeated, else the normalised zero action (the middle of
        the data's range; on relative dimensions the middle step, added to the observation's state). Counted."""
        bad = np.flatnonzero(~valid)
        if not len(bad):
            return
        previous, zero = self._previous_action, None
        for i in bad:
            if previous is not None and len(previous) == len(chunks):
                chunks[i] = previous[i].cpu()
                self.decode_stats.fallback_previous += 1
                continue
            if zero is None:  # the zero chunk through the outputs after detokenizing: unnormalised, made absolute
                raw_state = {OBS_STATE: batch[OBS_STATE]} if OBS_STATE in batch else {}
                zeros = np.zeros((len(chunks), self.config.time_horizon, self.config.action_dim))
                zero = run(self.pipeline.outputs[1:], {ACTION: zeros, **raw_state})[ACTION]
            chunks[i] = torch.as_tensor(zero[i], dtype=torch.float32)
            self.decode_stats.fallback_zero += 1
        self.decode_stats.invalid += len(bad)
        logger.warning(
            "%d of %d chunks did not decode (first: %s); fell back to the previous/zero action. decode_stats: %s",
            len(bad),
            len(chunks),
            errors[bad[0]],
            self.decode_stats.as_dict(),
        )

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any], **kwargs: Any) -> torch.Tensor:
        """One action ``[B, D]`` per call; a new chunk is predicted every ``n_action_steps`` calls, its first
        ``n_action_steps`` actions run (or, with ``temporal_ensemble``, every chunk covering the step is averaged)."""
        if self.config.n_obs_steps > 1 and OBS_STATE in batch:
            batch = self._with_history(batch)
        if self._actions.needs_chunk():
            self._actions.add(self.predict_action_chunk(batch, **kwargs))  # [B, T, D]
        action = self._actions.pop()
        self._previous_action = action
        return action

    def _with_history(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with its state [B, S] replaced by the last ``n_obs_steps`` states [B, n, S] this episode saw
        (the first repeated until there are n, as LeRobot pads), every call, so the history has no gaps."""
        state = torch.as_tensor(batch[OBS_STATE])
        if state.ndim == 3:  # the caller keeps the history
            return batch
        state = state[None] if state.ndim == 1 else state
        frames = self._history.frames
        if frames and frames[-1].shape != state.shape:
            raise ValueError(
                f"batch['{OBS_STATE}'] changed shape within an episode ({tuple(frames[-1].shape)} "
                f"-> {tuple(state.shape)}); call policy.reset() when a new episode starts"
            )
        return {**batch, OBS_STATE: torch.stack(self._history.push(state), dim=1)}

    # --- files --------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str | Path, *, state_dict: dict | None = None, **kwargs: Any) -> None:
        """Write the policy atomically (a temporary folder renamed into place); nothing needs pickle to load."""
        if kwargs.get("push_to_hub"):
            raise ValueError("push_to_hub is not supported (no network); save locally and upload the folder yourself")
        with atomic_directory(save_directory) as tmp:
            write_json(tmp / MANIFEST_FILE, {"format_version": FORMAT_VERSION, "type": self.name})
            self.config._save_pretrained(tmp)
            if state_dict is None:
                save_model(self, str(tmp / WEIGHTS_FILE))
            else:
                from huggingface_hub import save_torch_state_dict

                total = sum(t.numel() * t.element_size() for t in state_dict.values())
                save_torch_state_dict(state_dict, str(tmp), max_shard_size=max(total, 1))
            write_json(tmp / BACKBONE_CONFIG_FILE, self.model.backbone.config.to_dict())
            self.action_tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
            if self.action_normalizer is not None:  # none in a policy built without statistics
                self.action_normalizer.save(tmp / ACTION_NORMALIZER_FILE)
            if self.state_normalizer is not None:  # none without state, or without statistics
                self.state_normalizer.save(tmp / STATE_NORMALIZER_FILE)
            if isinstance(self.vocab.text, LocalTextTokenizer):
                self.vocab.text.save(tmp / TEXT_TOKENIZER_DIR)
            for pipeline in make_vla_pre_post_processors(self.config):  # for lerobot-eval and lerobot-rollout
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
        if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
            raise ValueError(
                f"{path} is not a saved VLA policy ({CONFIG_FILE} and {WEIGHTS_FILE} expected); pass the folder "
                "save_pretrained wrote (downloading from a hub is not supported)"
            )
        check_processor_files(path)  # before anything else reads the folder
        if (path / MANIFEST_FILE).is_file():  # policies saved before the manifest existed have the same layout
            read_json(path / MANIFEST_FILE, "VLA policy", format_version=FORMAT_VERSION)
        saved = load_policy_config(path)
        if config is None:
            config = saved
        else:  # LeRobot's parsed config, or a fine-tuning run's: only what the weights do not depend on may differ
            check_same_policy(saved, config, path)
        meta = kwargs.get("dataset_meta")  # LeRobot's trainer: the dataset this policy is about to train on
        if meta is not None and getattr(meta, "features", None):
            where, fps = getattr(meta, "root", "the dataset"), getattr(meta, "fps", None)
            check_dataset_fits(config, meta.features, path, where, fps)
        backbone_file = path / BACKBONE_CONFIG_FILE
        text_dir = path / TEXT_TOKENIZER_DIR
        # a policy built without statistics (from its config and features alone) saved no normaliser
        stats = (path / ACTION_NORMALIZER_FILE).is_file()
        if not stats and (path / STATE_NORMALIZER_FILE).is_file():
            raise ValueError(
                f"{path} holds {STATE_NORMALIZER_FILE} but not {ACTION_NORMALIZER_FILE}: the folder is incomplete "
                "(a policy built without statistics saves neither); copy the folder again, or save the policy again"
            )
        policy = cls(
            config,
            action_tokenizer=at.load_tokenizer(path / TOKENIZER_DIR),
            action_normalizer=at.Normalizer.load(path / ACTION_NORMALIZER_FILE) if stats else None,
            state_normalizer=at.Normalizer.load(path / STATE_NORMALIZER_FILE)
            if stats and config.state_dim != 0
            else None,
            text_tokenizer_dir=text_dir if text_dir.is_dir() else None,
            backbone_config=read_json(backbone_file, "backbone config") if backbone_file.is_file() else None,
        )
        weights = path / WEIGHTS_FILE
        fix = "the weights were converted or damaged: use the policy as vla saved it (float weights), or save it again"
        try:  # integer weights where the model holds floats would be cast silently (and act with errors of 1e9)
            check_tensor_kinds(weights, policy.state_dict(), fix)
            missing, unexpected = load_model(policy, str(weights), strict=strict, device="cpu")
        except Exception as err:  # safetensors' own errors name neither the file nor the fix
            if isinstance(err, ValueError) and str(weights) in str(err):  # check_tensor_kinds' own line
                raise
            raise ValueError(
                f"{path / WEIGHTS_FILE} cannot be read ({str(err).splitlines()[0][:200]}); the file is "
                "truncated or not a policy's weights (copy or save the policy again), or the config given "
                "differs from the saved one in its shapes (preset, vision_encoder, cameras, state, "
                "n_obs_steps)"
            ) from None
        if missing or unexpected:
            logger.warning("loading %s: missing keys %s, unexpected keys %s", path, missing, unexpected)
        bad = [name for name, t in policy.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
        if bad:
            raise ValueError(
                f"{path / WEIGHTS_FILE} holds NaN or inf in {len(bad)} tensors (first: {bad[0]}): the run "
                "that saved it diverged. Use an earlier checkpoint or train again"
            )
        policy.to(config.device)
        policy.eval()
        return policy
