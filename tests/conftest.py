"""Shared fixtures: tiny LeRobot datasets recorded from Meta-World's push-v3 expert, once per session.

    tiny_dataset_root        4 successful episodes (~60 frames each at 80 fps), state only
    tiny_image_dataset_root  2 episodes with a 64 px corner2 image per frame

Both are recorded by ``vla.sim.record`` with training seeds from 0 and are read-only for tests (copy
one with ``shutil.copytree`` before changing it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach the hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

TINY_EPISODES = 4
TINY_IMAGE_EPISODES = 2
TINY_IMAGE_SIZE = 64


@pytest.fixture(scope="session")
def tiny_dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state-only push-v3 dataset of 4 short expert episodes (LeRobot v3.0)."""
    from vla.sim.record import record

    root = tmp_path_factory.mktemp("datasets") / "push_tiny"
    record("push-v3", TINY_EPISODES, root, progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_image_dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A push-v3 dataset of 2 expert episodes with 64 px corner2 images (LeRobot v3.0)."""
    from vla.sim.record import record

    root = tmp_path_factory.mktemp("datasets") / "push_tiny_images"
    record("push-v3", TINY_IMAGE_EPISODES, root, images=True, image_size=TINY_IMAGE_SIZE, progress=False)
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
