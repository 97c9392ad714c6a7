"""The camera steps of the pipeline (``vla.policy.pipeline`` lists them in its one list of transforms): every camera resized
into one stacked ``images`` tensor, DrQ's random shift for training, and the check of one camera's frames."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from lerobot.utils.constants import OBS_STATE

Batch = dict[str, Any]
IMAGES = "images"  # the stacked cameras, float [B, N, 3, size, size] in [0, 1]


@dataclass(frozen=True)
class StackImages:
    """The cameras -> ``images`` float [B, N, 3, size, size] in [0, 1], each resized to the policy's square size
    whatever its own (64x64 and 48x80 cameras stack as two ``size`` squares); nothing without cameras."""

    keys: tuple[str, ...]
    size: int

    def __call__(self, batch: Batch) -> Batch:
        if not self.keys:
            return batch
        b = len(batch[OBS_STATE])
        return {**batch, IMAGES: torch.stack([camera_image(batch[k], k, b, self.size) for k in self.keys], dim=1)}


@dataclass(frozen=True)
class ShiftImages:
    """Training only: each stacked image moved by a random whole number of pixels, up to ``pad`` each way
    (edge-padded by ``pad``, then cropped back to its size at a random offset; DrQ's random shift, Kostrikov et al.
    2020). A camera policy trained on a few thousand frames otherwise memorises pixel positions."""

    pad: int

    def __call__(self, batch: Batch) -> Batch:
        if self.pad <= 0 or IMAGES not in batch:
            return batch
        images = batch[IMAGES]  # [B, N, 3, S, S]
        b, n, c, h, w = images.shape
        flat = F.pad(images.reshape(b * n, c, h, w), (self.pad,) * 4, mode="replicate")
        dy, dx = torch.randint(0, 2 * self.pad + 1, (2, b * n)).tolist()
        shifted = torch.stack([flat[i, :, y : y + h, x : x + w] for i, (y, x) in enumerate(zip(dy, dx))])
        return {**batch, IMAGES: shifted.reshape(b, n, c, h, w)}


PIXEL_SLACK = 1e-3  # float pixels a resampling overshot by this much still count as [0, 1]


def camera_image(image: Any, key: str, b: int, size: int | None) -> torch.Tensor:
    """One camera ``[B, 3, H, W]`` (or ``[3, H, W]``; uint8 or float in [0, 1]) -> float ``[B, 3, size, size]``
    (``size=None`` keeps the camera's own size)."""
    img = torch.as_tensor(image)
    img = img[None] if img.ndim == 3 else img
    if img.ndim != 4 or img.shape[0] != b or img.shape[1] != 3:
        raise ValueError(f"batch['{key}'] has shape {tuple(img.shape)}; expected [B={b}, 3, H, W] (channels first)")
    if img.dtype == torch.uint8:
        img = img.float() / 255.0
    elif img.is_floating_point():
        img = img.float()
        if not torch.isfinite(img).all():
            raise ValueError(f"batch['{key}'] holds NaN or inf; check the camera")
        lo, hi = float(img.min()), float(img.max())
        if lo < -PIXEL_SLACK or hi > 1.0 + PIXEL_SLACK:
            raise ValueError(
                f"batch['{key}'] is a float image with values in [{lo:g}, {hi:g}]; float images must lie "
                "in [0, 1]: pass uint8 0..255, or divide 0..255 floats by 255"
            )
    else:
        raise ValueError(
            f"batch['{key}'] is {str(img.dtype).removeprefix('torch.')}; cameras are uint8 in 0..255 or "
            "float in [0, 1] (a 16-bit image: (image >> 8) as uint8)"
        )
    if size is not None and img.shape[-2:] != (size, size):
        img = F.interpolate(img, size=(size, size), mode="bilinear", antialias=True)
    return img
