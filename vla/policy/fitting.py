"""What a policy's normaliser and tokenizer are fitted on, written once for ``vla train`` (``vla.policy.factory``) and
for LeRobot's trainer (``VLAPolicy`` given a dataset): the action chunks of the training episodes as the model
predicts them, relative to the chunk's first state on the dimensions the config makes relative."""

from __future__ import annotations

import logging
from pathlib import Path

import action_tokenizers as at
import numpy as np
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.data import columns, reader
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


def policy_tokenizer(
    config: VLAConfig, root: Path | None, action_normalizer: at.Normalizer | None
) -> at.ActionTokenizer:
    """The tokenizer at ``config.action_tokenizer_path``; else, when LeRobot's trainer passes the dataset (``root``),
    one of ``config.action_tokenizer_type`` fitted on its episodes' normalised chunks as ``vla train`` fits it (vla's
    default options), with the prompt's words from the dataset's tasks in the compact vocabulary, as ``vla train``
    gives them (``config.text_words``, saved in config.json); else, from the config and its features alone, one that
    learns nothing from data (``bin``)."""
    if config.action_tokenizer_path is not None:
        return at.load_tokenizer(config.action_tokenizer_path)
    if root is None or action_normalizer is None:
        return unfitted_tokenizer(config)
    info = reader.dataset_info(root)
    if not config.text_words and config.backbone_path is None:
        config.text_words = prompt_words(info.tasks)
    chunks = predicted_chunks(info, config, None)  # every episode: LeRobot's trainer trains on them all
    logger.info(
        "fitting a %s action tokenizer on %d chunks of %s (no action_tokenizer_path given)",
        config.action_tokenizer_type,
        len(chunks),
        root,
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
