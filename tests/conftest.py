"""Shared fixtures and helpers (test modules take helpers from here, never from each other).

    tiny_dataset_root        4 successful push-v3 expert episodes (~60 frames each at 80 fps), state only
    tiny_image_dataset_root  2 episodes with a 64 px corner2 image per frame
    gemma_like_dir           a stand-in for PaliGemma's Gemma tokenizer.json
    T, D, fitted_tokenizers  small synthetic chunks and one tokenizer of each kind fitted on them
    assert_plot              a PNG that shows something: its size, and coloured marks beyond grey axes and text
    train_micro_policy       a micro FAST policy trained 2 steps on a dataset: its saved policy folder

The datasets are recorded by ``vla.sim.record`` with training seeds from 0 and are read-only for tests (copy
one with ``shutil.copytree`` before changing it).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach the hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")


def assert_plot(path: Path, min_width: int = 300, min_height: int = 200, coloured: bool = True) -> None:
    """``path`` is a drawn plot: a PNG at least ``min_width`` x ``min_height`` pixels, neither blank nor one fill, with
    coloured pixels (data series: axes, ticks and text are grey or black, so a figure of empty axes fails); a grey
    image (``coloured=False``, an attention mask) must instead mark a tenth of the figure."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", f"{path} is not a PNG"
        rgb = np.asarray(image.convert("RGB"), dtype=np.int16)
    height, width, _ = rgb.shape
    assert width >= min_width and height >= min_height, f"{path} is {width} x {height} pixels"
    ink = (rgb.min(axis=2) < 200).mean()  # any pixel darker than a light grey
    assert 0.002 < ink < 0.9, f"{path}: {ink:.1%} of its pixels are marked (blank, or one fill)"
    if not coloured:
        assert ink > 0.1, f"{path}: only {ink:.1%} of its pixels are marked"
        return
    colour = ((rgb.max(axis=2) - rgb.min(axis=2)) > 60).mean()  # saturated: a data series, not an axis
    assert colour > 0.0005, f"{path} holds no coloured marks: axes without data?"


def train_micro_policy(dataset_root: Path, output_dir: Path, tokenizer=None) -> str:
    """A micro policy (T = 4; FAST with 256 ids unless ``tokenizer``, a tokenizer config, says otherwise) trained 2
    steps on ``dataset_root``: the policy folder it saved."""
    from vla import train
    from vla.policy import VLAConfig
    from vla.tokenizer_choice import tokenizer_config

    cfg = train.TrainConfig(
        dataset_root=str(dataset_root),
        output_dir=str(output_dir),
        tokenizer=tokenizer or tokenizer_config("fast", vocab_size=256),
        steps=2,
        batch_size=4,
        save_every=2,
        log_every=1,
        progress=False,
        policy=VLAConfig(preset="micro", time_horizon=4, n_action_steps=2, device="cpu"),
    )
    return train.main(cfg)["policy_path"]


TINY_EPISODES = 4
TINY_IMAGE_EPISODES = 2
TINY_IMAGE_SIZE = 64


@pytest.fixture(scope="session")
def tiny_dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state-only push-v3 dataset of 4 short expert episodes (LeRobot v3.0)."""
    from vla.sim.record import record

    root = tmp_path_factory.mktemp("datasets") / "push_tiny"
    record("metaworld/push-v3", TINY_EPISODES, root, progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_image_dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A push-v3 dataset of 2 expert episodes with 64 px corner2 images (LeRobot v3.0)."""
    from vla.sim.record import record

    root = tmp_path_factory.mktemp("datasets") / "push_tiny_images"
    record(
        "metaworld/push-v3",
        TINY_IMAGE_EPISODES,
        root,
        images=True,
        image_size=TINY_IMAGE_SIZE,
        image_format="png",
        progress=False,
    )
    return root


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of many tiny ops: on a shared 2-core machine, two spinning threads made
    them up to 100x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


T, D = 10, 3  # small chunks keep every test fast


@functools.cache
def fitted_tokenizers() -> dict:
    """One small tokenizer of each kind, fitted on synthetic chunks ``[N, T, D]`` (shared by the vla tests)."""
    import action_tokenizers as at
    import torch
    from action_tokenizers.synthetic import smooth_chunks

    chunks = smooth_chunks(600, T, D, seed=0)
    with torch.random.fork_rng(devices=[]):
        fsq = at.FSQTokenizer.fit(chunks, hidden=16, depth=0, steps=50, show_progress=False)
    return {
        "fast": at.FASTTokenizer.fit(chunks, vocab_size=256),
        "fast_byte_level": at.FASTTokenizer.fit(chunks, vocab_size=256, byte_level=True),
        "bin": at.BinningTokenizer.fit(chunks, n_bins=256),
        "fsq": fsq,
    }


def write_gemma_like_tokenizer(directory) -> None:
    """A stand-in for PaliGemma's Gemma tokenizer.json (word-level, same special ids); no download needed."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<eos>", "<bos>", "<unk>", "|", "Action", ":", "Task", "State", ",", ";", "pick"]
    vocab = {w: i for i, w in enumerate(words)} | {str(i): len(words) + i for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="session")
def gemma_like_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma")
    write_gemma_like_tokenizer(directory)
    return directory
