"""Vision encoders that can stand in for PaliGemma's SigLIP tower: ``vision_encoder = "siglip" | "keypoints" | "conv"``.

    tower = KeypointEncoder(hidden=128, tokens=16)              # 64 px -> a 16 x 16 map -> 16 keypoints
    out = tower(pixel_values)                                   # pixel_values [B*N, 3, S, S] in [-1, 1]
    out.last_hidden_state                                       # [B*N, 16, 128]: one token per keypoint

``KeypointEncoder`` is the low-data recipe of robot learning: a small conv stem, then a spatial softmax that turns
each of ``tokens`` feature channels into the expected (x, y) image coordinate of its activation (Levine, Finn,
Darrell and Abbeel 2016, "End-to-end training of deep visuomotor policies"; robomimic and Diffusion Policy keep it).
A 2-layer SigLIP trained from scratch on 200 demonstrations did not localise a ~4 px object inside its 16 px patch;
a keypoint is a coordinate by construction, so "where is the puck" is one number pair the decoder reads directly.

``ConvEncoder`` is the pixel-RL recipe (SAC-AE, Yarats et al. 2019; DrQ, Kostrikov, Yarats and Fergus 2020): a conv
stem whose feature map is flattened and mapped by one linear layer, so that every place in the image has weights
of its own and "where" becomes a linear read-out. Trained inside the policy from scratch, it is the one of the three
that learned to see (README "From pixels"): SigLIP's patches and the keypoints' spatial softmax start with the
object's position all but absent from their tokens, the decoder learns to ignore them within ~50 steps, and the
gradient into the tower dies with it.

Each returns what SigLIP returns to ``get_image_features`` (``BaseModelOutputWithPooling.last_hidden_state``
``[B*N, tokens, hidden]``), so PaliGemma's projector, the image placeholders, both decoding paths (transformers'
and ``vla.model.lean``) and the safetensors state dict work unchanged. ``vla.model.prefix_lm.build_model`` swaps it in for the
vision tower; the number of tokens is the backbone's ``image_tokens`` (one per SigLIP patch), the one count the
sequence layout reads.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

VISION_ENCODERS = ("siglip", "keypoints", "conv")  # VLAConfig.vision_encoder's choices
STRIDE = 4  # the keypoint stem's downsampling: a 64 px image gives a 16 x 16 map
CONV_STRIDE = 8  # the conv encoder's: a 64 px image gives an 8 x 8 map
STRIDES = {"keypoints": STRIDE, "conv": CONV_STRIDE}  # what an image's side must be a multiple of, per tower


def spatial_softmax(logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected image coordinates of each channel's softmax over the map (Levine et al. 2016's spatial softmax).

    ``logits`` ``[B, K, H, W]`` -> ``(xy [B, K, 2], weights [B, K, H*W])``. ``x`` runs along the width (columns),
    ``y`` along the height (rows); pixel centres sit on ``linspace(-1, 1)``, so the top-left cell is (-1, -1) and the
    bottom-right (1, 1). ``weights`` is the softmax itself (each row sums to 1), for reading features at a keypoint.
    Computed in float32 whatever the input's dtype (bfloat16 would round a coordinate to ~1/128), returned in it.
    """
    b, k, h, w = logits.shape
    weights = torch.softmax(logits.float().reshape(b, k, h * w) / temperature, dim=-1)  # [B, K, HW]
    ys, xs = torch.meshgrid(
        torch.linspace(-1.0, 1.0, h, device=logits.device),
        torch.linspace(-1.0, 1.0, w, device=logits.device),
        indexing="ij",
    )
    grid = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)  # [HW, 2]: (x, y) of every cell, row-major
    return (weights @ grid).to(logits.dtype), weights.to(logits.dtype)


def _block(cin: int, cout: int, stride: int) -> nn.Sequential:
    """3x3 conv -> GroupNorm -> ReLU (GroupNorm, not BatchNorm: no running statistics, the same in train and eval)."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.GroupNorm(min(8, cout), cout),
        nn.ReLU(inplace=True),
    )


class KeypointEncoder(nn.Module):
    """Conv stem (overall stride 4) -> 1x1 conv to ``tokens`` keypoint maps -> spatial softmax with a learned
    temperature -> one token per keypoint: an MLP of its (x, y) and the stem's features averaged under its softmax,
    plus a learned embedding per keypoint so the decoder can tell them apart, layer-normalised.
    ``[B, 3, S, S]`` -> ``[B, tokens, hidden]``.

    ``channels``: the stem's widths; the first block halves the resolution, the second halves it again, the rest keep
    it. The default (16, 32, 32) sees 15 px around each map cell (a 4 px puck and its surroundings) and costs about as
    much as the tiny preset's 2-layer SigLIP: at 64 px, 32 images, one (shared) CPU thread, 8-10 ms forward and
    30-35 ms forward + backward (SigLIP: 8 ms and 20-23 ms) with 38k parameters (SigLIP: 366k). A fourth block
    (23 px) cost ~15 ms forward.
    """

    def __init__(self, hidden: int, tokens: int, channels: tuple[int, ...] = (16, 32, 32)):
        super().__init__()
        if len(channels) < 2:
            raise ValueError(f"the keypoint stem needs at least 2 conv blocks (stride 2 each), got channels={channels}")
        self.hidden, self.tokens, self.channels = int(hidden), int(tokens), tuple(int(c) for c in channels)
        widths = (3, *self.channels)
        self.stem = nn.Sequential(
            *(_block(cin, cout, 2 if i < 2 else 1) for i, (cin, cout) in enumerate(zip(widths, widths[1:])))
        )
        feat = self.channels[-1]
        self.keypoints = nn.Conv2d(feat, self.tokens, 1)  # one attention map per keypoint
        self.log_temperature = nn.Parameter(torch.zeros(()))  # softmax temperature exp(.) = 1 at the start
        self.embed = nn.Sequential(nn.Linear(2 + feat, self.hidden), nn.GELU(), nn.Linear(self.hidden, self.hidden))
        self.token_embedding = nn.Parameter(torch.randn(self.tokens, self.hidden) * 0.1)  # ~ the MLP's output scale
        self.norm = nn.LayerNorm(self.hidden)  # unit-scale tokens for the projector, as SigLIP's post-layernorm gives

    def forward(self, pixel_values: torch.Tensor, **_) -> BaseModelOutputWithPooling:
        """``pixel_values`` ``[B, 3, S, S]`` (SigLIP's [-1, 1] range; S a multiple of 4) -> ``last_hidden_state``
        ``[B, tokens, hidden]``; other keyword arguments (SigLIP's) are accepted and ignored."""
        if pixel_values.ndim != 4 or pixel_values.shape[1] != 3 or pixel_values.shape[-1] % STRIDE:
            raise ValueError(
                f"the keypoint encoder reads RGB images [B, 3, S, S] with S a multiple of {STRIDE}, got "
                f"shape {tuple(pixel_values.shape)}"
            )
        features = self.stem(pixel_values)  # [B, C, S/4, S/4]
        xy, weights = spatial_softmax(self.keypoints(features), self.log_temperature.exp())  # [B, K, 2], [B, K, HW]
        attended = weights @ features.flatten(2).transpose(1, 2)  # [B, K, C]: the features under each keypoint
        tokens = self.embed(torch.cat([xy, attended], dim=-1)) + self.token_embedding  # [B, K, hidden]
        return BaseModelOutputWithPooling(last_hidden_state=self.norm(tokens))

    def keypoints_xy(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The keypoints themselves, ``[B, tokens, 2]`` (x, y) in [-1, 1]: for plotting what the encoder looks at."""
        return spatial_softmax(self.keypoints(self.stem(pixel_values)), self.log_temperature.exp())[0]


class ConvEncoder(nn.Module):
    """Conv stem (three stride-2 blocks, overall stride 8) -> the feature map flattened -> one linear layer ->
    LayerNorm: one feature vector of width ``hidden`` per image, given to each of the ``tokens`` tokens plus a learned
    embedding per token (the count the sequence layout reads; the tokens carry one vector between them).
    ``[B, 3, S, S]`` -> ``[B, tokens, hidden]``, S a multiple of 8.

    At 64 px with the default (32, 32, 32) the linear layer reads 32 x 8 x 8 = 2048 values (262k weights at width
    128; 1M at 128 px): the parameters sit in the map from place to feature, where a position is learned directly.
    """

    def __init__(self, hidden: int, tokens: int, image_size: int, channels: tuple[int, ...] = (32, 32, 32)):
        super().__init__()
        if len(channels) != 3:
            raise ValueError(f"the conv encoder has 3 stride-2 blocks, so it needs 3 channel widths, got {channels}")
        if image_size % CONV_STRIDE:
            raise ValueError(
                f"the conv encoder reads images whose size is a multiple of {CONV_STRIDE}, got {image_size}"
            )
        self.hidden, self.tokens, self.image_size = int(hidden), int(tokens), int(image_size)
        widths = (3, *(int(c) for c in channels))
        self.stem = nn.Sequential(*(_block(cin, cout, 2) for cin, cout in zip(widths, widths[1:])))
        side = self.image_size // CONV_STRIDE
        self.project = nn.Linear(widths[-1] * side * side, self.hidden)
        self.norm = nn.LayerNorm(self.hidden)
        self.token_embedding = nn.Parameter(torch.randn(self.tokens, self.hidden) * 0.1)

    def forward(self, pixel_values: torch.Tensor, **_) -> BaseModelOutputWithPooling:
        """``pixel_values`` ``[B, 3, S, S]`` in [-1, 1] -> ``last_hidden_state`` ``[B, tokens, hidden]``; other keyword
        arguments (SigLIP's) are accepted and ignored."""
        s = self.image_size
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != (3, s, s):
            raise ValueError(
                f"the conv encoder reads RGB images [B, 3, {s}, {s}], got shape {tuple(pixel_values.shape)}"
            )
        feature = self.norm(self.project(self.stem(pixel_values).flatten(1)))  # [B, hidden]
        return BaseModelOutputWithPooling(last_hidden_state=feature[:, None] + self.token_embedding)


def build_tower(name: str, hidden: int, tokens: int, image_size: int) -> nn.Module:
    """The randomly initialised tower that replaces SigLIP for ``vision_encoder = name`` ("keypoints" or "conv"):
    ``tokens`` tokens of width ``hidden`` per ``image_size`` square image."""
    if name == "keypoints":
        return KeypointEncoder(hidden, tokens)
    if name == "conv":
        return ConvEncoder(hidden, tokens, image_size)
    raise ValueError(f"no tower replaces SigLIP for vision encoder {name!r}; use one of {', '.join(STRIDES)}")
