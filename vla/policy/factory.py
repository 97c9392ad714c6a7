"""The one place a policy is built from a dataset: ``build_policy`` (``vla train``: normalisers from the training
frames' exact quantiles, the tokenizer fitted on the training chunks as the model predicts them, a new model) and
``finetune_policy`` (a saved policy trained further on new data, its tokenizer and normalisers kept). LeRobot's
trainer builds ``VLAPolicy`` from a dataset itself, its normalisers and tokenizer from the same functions
(``vla.policy.fitting``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import action_tokenizers as at
import numpy as np

from vla.config import TrainConfig, resolve_action_state
from vla.data import columns, reader
from vla.model.text import prompt_words
from vla.policy.fitting import data_normalizers, predicted_chunks
from vla.policy.modeling_vla import VLAPolicy
from vla.policy.saved_config import check_dataset_fits, check_policy_folder, check_same_policy, load_policy_config
from vla.tokenizer_choice import NORMALIZER_FILE


def build_policy(cfg: TrainConfig, info: reader.DatasetInfo, train_episodes: list[int]) -> VLAPolicy:
    """Normalisers from the training frames, the tokenizer fitted on the training episodes' chunks, a new model.
    With relative actions both the action normaliser and the tokenizer are fitted on what the model predicts: the
    training chunks relative to their first frame's state (openpi computes its norm stats after DeltaActions too).
    With ``policy.pretrained_path`` (``--policy.path``) the saved policy instead (``finetune_policy``)."""
    if cfg.policy.pretrained_path is not None:
        return finetune_policy(cfg, info, train_episodes)
    if cfg.policy.fps is not None and float(cfg.policy.fps) != float(info.fps):
        given = cfg.policy.fps
        raise ValueError(f"VLAConfig.fps = {given:g} but {info.root} is {info.fps:g} fps; leave fps unset (recorded)")
    stateless = cfg.policy.state_dim == 0 or info.state_dim is None  # an image-only policy
    # The compact vocabulary gives the prompt's words one id each (PaliGemma's own tokenizer already does).
    config = resolve_action_state(
        dataclasses.replace(
            cfg.policy,
            text_words=[] if cfg.policy.backbone_path else prompt_words(info.tasks),
            action_dim=info.action_dim,
            state_dim=0 if stateless else info.state_dim,
            fps=float(info.fps),
            init_seed=cfg.seed if cfg.policy.init_seed is None else cfg.policy.init_seed,
        ),
        info,
    )
    chunks = predicted_chunks(info, config, train_episodes)
    action_norm, state_norm = data_normalizers(info, config, chunks, train_episodes)
    mask = config.relative_mask()
    if config.n_obs_steps > 1 and state_norm is not None and config.state_delta_scale is None:
        config.state_delta_scale = delta_scale(columns.state_changes(info, episodes=train_episodes) / state_norm.scale)
    pretrained = Path(cfg.tokenizer.pretrained_path) if cfg.tokenizer.pretrained_path else None
    if pretrained is not None and (pretrained / NORMALIZER_FILE).is_file():  # `vla tokenizer fit`: its own normaliser
        if mask is not None:
            raise ValueError(
                f"{pretrained} holds a tokenizer fitted on absolute actions, but the policy predicts "
                "relative ones; train without --tokenizer.pretrained_path (the tokenizer is then fitted "
                "on the relative chunks) or with --policy.relative_actions=none"
            )
        action_norm = at.Normalizer.load(pretrained / NORMALIZER_FILE)
    tokenizer = cfg.tokenizer.build(action_norm.normalize(chunks))
    return VLAPolicy(config, action_tokenizer=tokenizer, action_normalizer=action_norm, state_normalizer=state_norm)


def finetune_policy(cfg: TrainConfig, info: reader.DatasetInfo, train_episodes: list[int]) -> VLAPolicy:
    """The saved policy at ``cfg.policy.pretrained_path``, to train further: its weights, tokenizer and normalisers as
    saved (the weights learnt those action ids and normalised ranges; refitting either would change what they mean),
    with ``cfg.policy`` (the folder's config and the command line's optimiser, schedule or decoding changes). Prints
    how much of the new data falls outside the normalised range the tokenizer was fitted on."""
    path = Path(cfg.policy.pretrained_path)
    policy = VLAPolicy.from_pretrained(path, config=cfg.policy)
    chunks = predicted_chunks(info, policy.config, train_episodes)  # what its normaliser saw
    outside = float(np.mean(np.abs(policy.action_normalizer.normalize(chunks)) > 1))
    print(
        f"fine-tuning {path}: its weights, {policy.action_tokenizer.name} tokenizer and normalisers kept; "
        f"{outside:.1%} of the new training actions fall outside [-1, 1] once normalised"
    )
    if policy.config.fps is None:  # saved before policies recorded it: the rate it is trained on from now on
        print(f"{path} does not record the fps of its training data; it now records this data's, {info.fps:g} fps")
        policy.config.fps = float(info.fps)
    return policy


def check_finetuning(cfg: TrainConfig, info: reader.DatasetInfo) -> None:
    """Before any change to the run folder: ``policy.pretrained_path`` is a saved policy whose settings are
    ``cfg.policy``'s, and the dataset has its action and state dimensions and cameras."""
    path = Path(cfg.policy.pretrained_path)
    check_policy_folder(path, "--policy.path")
    saved = load_policy_config(path)
    try:
        check_same_policy(saved, cfg.policy, path)
    except ValueError as err:
        raise ValueError(
            f"{err}. (--policy.path=DIR on the command line starts from the folder's own config)"
        ) from None
    check_dataset_fits(cfg.policy, info.features, path, info.root, fps=info.fps)  # its settings are saved's (above)


def delta_scale(changes: np.ndarray) -> list[float]:
    """Per state dim, 1 / the 99th percentile of one frame's normalised change (1 for a dim that never moves)."""
    q99 = np.quantile(np.abs(changes), 0.99, axis=0)
    return [float(1.0 / q) if q > 1e-9 else 1.0 for q in q99]
