"""A policy's normalisers and tokenizer from its data, written once for ``vla train`` (``vla.policy.factory``) and
for LeRobot's trainer (``VLAPolicy`` given LeRobot's ``dataset_meta``): the normalisers from exact quantiles of the
training frames, the tokenizer fitted on the training episodes' action chunks as the model predicts them (relative to
the chunk's first state on the dimensions the config makes relative), normalised."""

from __future__ import annotations

import logging
from typing import Any

import action_tokenizers as at
import numpy as np
import torch
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data import columns, reader
from vla.data.stats import array_stats, frame_stats
from vla.model.text import prompt_words
from vla.policy.configuration_vla import VLAConfig
from vla.policy.pipeline import RelativeActions
from vla.tokenizer_choice import parse_choice

logger = logging.getLogger(__name__)


def predicted_chunks(info: reader.DatasetInfo, config: VLAConfig, episodes: list[int] | None) -> np.ndarray:
    """float32 [N, T, D]: every chunk of ``episodes`` (None: all) at ``config.time_horizon``, relative where
    ``config.relative_mask()`` says (raw units, before any normaliser)."""
    chunks, _ = columns.action_chunks(info, config.time_horizon, episodes=episodes)
    mask = config.relative_mask()
    if mask is not None:
        states = columns.chunk_states(info, episodes=episodes)
        chunks = RelativeActions(mask, tuple(config.action_state_dims))({ACTION: chunks, OBS_STATE: states})[ACTION]
    return chunks


def data_normalizers(
    info: reader.DatasetInfo, config: VLAConfig, chunks: np.ndarray, episodes: list[int] | None
) -> tuple[at.Normalizer, at.Normalizer | None]:
    """The action and state normalisers (``config.action_norm_mode``, ``config.state_norm_mode``) from exact
    statistics of ``episodes``' frames (None: all; LeRobot's ``stats.json`` quantiles are too narrow, see
    ``vla.data.stats.load_stats``); with relative actions the action's from ``chunks``, what the model predicts
    (openpi computes its norm stats after DeltaActions too). No state normaliser for a policy without state."""
    stateless = config.state_dim == 0 or info.state_dim is None
    stats = frame_stats(info, [ACTION] if stateless else [ACTION, OBS_STATE], episodes=episodes)
    if config.relative_mask() is not None:
        stats[ACTION] = array_stats(chunks.reshape(-1, chunks.shape[-1]))
    action = at.Normalizer.from_stats(stats[ACTION], config.action_norm_mode)
    return action, None if stateless else at.Normalizer.from_stats(stats[OBS_STATE], config.state_norm_mode)


def normalizer_from_stats(stats: dict[str, dict[str, Any]] | None, key: str, mode: str) -> at.Normalizer:
    """The normaliser of ``key`` from LeRobot's dataset stats (``{key: {"q01": ..., "q99": ..., ...}}``), for a
    policy given statistics rather than its dataset."""
    if stats is None or key not in stats:
        raise ValueError(
            f"no normaliser for {key!r}: pass {'action' if key == ACTION else 'state'}_normalizer=at.Normalizer(...) "
            f"or dataset_stats holding {key!r}"
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
                "(`vla data stats`, or build the policy with its dataset_meta, as LeRobot's trainer does) or use the "
                "mean_std mode.",
                key,
                collapsed.tolist(),
            )
    return at.Normalizer.from_stats(entry, mode)


def policy_tokenizer(
    config: VLAConfig, data: tuple[reader.DatasetInfo, np.ndarray] | None, action_normalizer: at.Normalizer | None
) -> at.ActionTokenizer:
    """The tokenizer at ``config.action_tokenizer_path``; else, when LeRobot's trainer passes the dataset (``data``:
    its info and ``predicted_chunks``), one of ``config.action_tokenizer_type`` fitted on the normalised chunks as
    ``vla train`` fits it (vla's default options), with the prompt's words from the dataset's tasks in the compact
    vocabulary, as ``vla train`` gives them (``config.text_words``, saved in config.json); else, from the config and
    its features alone, one that learns nothing from data (``bin``)."""
    if config.action_tokenizer_path is not None:
        return at.load_tokenizer(config.action_tokenizer_path)
    if data is None or action_normalizer is None:
        return unfitted_tokenizer(config)
    info, chunks = data
    if not config.text_words and config.backbone_path is None:
        config.text_words = prompt_words(info.tasks)
    logger.info(
        "fitting a %s action tokenizer on %d chunks of %s (no action_tokenizer_path given)",
        config.action_tokenizer_type,
        len(chunks),
        info.root,
    )
    tok = parse_choice(config.action_tokenizer_type).fit(action_normalizer.normalize(chunks))
    for line in tok.choices():  # what the fit chose from the data, said (and saved with the tokenizer)
        logger.info("chose tokenizer.%s", line)
    return tok


def unfitted_tokenizer(config: VLAConfig) -> at.ActionTokenizer:
    """A tokenizer of ``config.action_tokenizer_type`` built from the config's chunk shape alone (the time horizon,
    the action's dimension from ``action_dim`` or the output features), for one that learns nothing from data; the
    others refuse, saying how to give one."""
    feature = (config.output_features or {}).get(ACTION)
    action_dim = config.action_dim or (feature.shape[-1] if feature is not None else None)
    if config.time_horizon is None or action_dim is None:
        raise ValueError(
            "no action tokenizer and no data to fit one on: give VLAConfig.time_horizon and the action's dimension "
            "(output_features or action_dim), or pass action_tokenizer=... / action_tokenizer_path"
        )
    try:
        return parse_choice(config.action_tokenizer_type).unfitted(config.time_horizon, int(action_dim))
    except ValueError as err:
        raise ValueError(
            f"no action tokenizer: {err}. Pass action_tokenizer=..., set VLAConfig.action_tokenizer_path to a folder "
            "written by tok.save_pretrained (e.g. --policy.action_tokenizer_path=outputs/tok), or let LeRobot's "
            "trainer fit one on its dataset (it does when no path is given)"
        ) from None
