"""The prefix-LM: transformers' ``PaliGemmaForConditionalGeneration`` (SigLIP vision tower + Gemma decoder).

Two verbs:
    loss, metrics = model.loss(seq, images)          # cross-entropy on the suffix (the action segment) only
    gen = vla.model.decode.generate(model, prompt, images=images, vocab=..., constraint=...)

Sizes come from named presets (``vla.model.presets.PRESETS``): ``tiny`` trains on a laptop CPU, ``small`` is a ~50M model for a GPU,
``paligemma-3b`` is the real shape (Gemma 2B + SigLIP So400m/14 at 224 px) and loads weights from a local copy of
a public PaliGemma checkpoint. ``micro`` exists for tests only. ``vision_encoder="keypoints"`` swaps the SigLIP tower
for ``vla.model.vision.KeypointEncoder`` (a conv stem and a spatial softmax, one token per keypoint); everything else stays.

How the mask reaches PaliGemma: we pass our own 4-D additive mask (``vla.model.sequence.prefix_lm_mask``, 0 where a query
may attend a key, the dtype's minimum elsewhere). transformers' mask builder returns a 4-D mask unchanged, so
the same code path serves training, prefill and cached decoding, and padding never leaks. PaliGemma's own route
(2-D padding mask + ``token_type_ids``) builds the same mask; ``tests/test_model.py`` checks the two agree.
``token_type_ids`` are still passed: PaliGemma refuses a training-mode forward without them.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

from vla.model.lean import LeanSteps, suffix_hidden
from vla.model.presets import ModelPreset, get_preset, paligemma_config
from vla.model.sequence import Sequence
from vla.model.vision import STRIDES, VISION_ENCODERS, build_tower
from vla.model.vocab import VocabMap
from vla.names import check_name


def build_model(
    preset: str | ModelPreset,
    vocab: VocabMap,
    *,
    image_size: int | None = None,
    num_cameras: int = 1,
    pretrained_path: str | Path | None = None,
    backbone_config: PaliGemmaConfig | dict | None = None,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    seed: int | None = None,
    state_dim: int | None = None,
    state_tokens: int = 0,
    query_slots: int = 0,
    vision_encoder: str = "siglip",
) -> PrefixLM:
    """A ``PrefixLM`` of the named size over ``vocab``.

    Random weights by default (``seed`` initialises them without touching the global RNG). ``pretrained_path``: a
    local PaliGemma checkpoint folder (config.json + safetensors), read with no network. ``backbone_config``: build
    exactly this ``PaliGemmaConfig`` (what a saved policy stores) instead of the preset's. ``state_tokens`` > 0 adds a
    ``StateEncoder`` from a ``state_dim`` state to that many prefix embeddings (``state_encoding="embedding"``).
    ``query_slots`` > 0 adds a ``SlotEmbedding`` of that many learned inputs (``decoding="parallel"``).
    ``vision_encoder``: ``"siglip"`` (PaliGemma's tower), ``"keypoints"`` or ``"conv"``: the tower is replaced by a
    randomly initialised ``KeypointEncoder`` or ``ConvEncoder`` (``vla.model.vision.build_tower``) giving as many tokens
    per camera as SigLIP would (``PrefixLM.image_tokens``), at SigLIP's width, so the projector, the image
    placeholders and both decoding paths read it unchanged (the backbone config, saved with a policy, still describes
    a SigLIP tower: its image size, patch size and width set the shapes).
    """
    vision_encoder = check_name("vision encoder", vision_encoder, VISION_ENCODERS)
    if pretrained_path is not None:
        path = Path(pretrained_path)
        if not (path / "config.json").is_file():
            raise ValueError(f"no PaliGemma checkpoint at {path} (config.json missing); pass the local folder")
        backbone = PaliGemmaForConditionalGeneration.from_pretrained(
            path, local_files_only=True, attn_implementation=attn_implementation, dtype=dtype
        )
    else:
        if backbone_config is None:
            config = paligemma_config(get_preset(preset), vocab, image_size=image_size, num_cameras=num_cameras)
        elif isinstance(backbone_config, dict):
            config = PaliGemmaConfig.from_dict(backbone_config)
        else:
            config = backbone_config
        config._attn_implementation = attn_implementation
        backbone = _seeded(seed, 0, lambda: PaliGemmaForConditionalGeneration(config).to(dtype))
    rows = backbone.config.text_config.vocab_size
    if rows < vocab.model_vocab_size or backbone.config.image_token_id != vocab.text.image_id:
        raise ValueError(
            f"the backbone has {rows} vocabulary rows and image id {backbone.config.image_token_id}, but the "
            f"vocabulary map needs {vocab.model_vocab_size} rows and image id {vocab.text.image_id}; "
            "use VocabMap.paligemma with a PaliGemma checkpoint's tokenizer"
        )
    if state_tokens and not state_dim:
        raise ValueError("state_tokens > 0 needs state_dim: the size of the state the encoder reads")
    hidden, device = backbone.config.text_config.hidden_size, backbone.device
    encoder = slots = None
    if state_tokens:
        encoder = _seeded(seed, 1, lambda: StateEncoder(state_dim, hidden, state_tokens).to(device=device, dtype=dtype))
    if query_slots:
        slots = _seeded(seed, 2, lambda: SlotEmbedding(query_slots, hidden).to(device=device, dtype=dtype))
    model = PrefixLM(backbone, encoder, slots)
    if vision_encoder != "siglip":
        stride = STRIDES[vision_encoder]
        if model.image_size % stride:
            size, step = model.image_size, math.lcm(stride, int(backbone.config.vision_config.patch_size))
            raise ValueError(
                f"the {vision_encoder} encoder reads images whose size is a multiple of {stride}, but "
                f"the backbone's is {size}; set image_size to e.g. {size - size % step or step}"
            )
        width = backbone.config.vision_config.hidden_size  # the projector's input
        tower = _seeded(seed, 3, lambda: build_tower(vision_encoder, width, model.image_tokens, model.image_size))
        backbone.model.vision_tower = tower.to(device=device, dtype=dtype)
    return model


def _seeded(seed: int | None, offset: int, make):
    """``make()`` with torch's random state seeded by ``seed + offset`` (when a seed is given), the global state
    untouched: each part of a model draws its initial weights from its own stream."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed + offset)
        return make()


class StateEncoder(nn.Module):
    """The normalised state ``[B, S]`` -> ``tokens`` prefix embeddings ``[B, tokens, hidden]`` (a two-layer MLP).

    pi0 feeds its continuous state through a linear layer; pi0-FAST writes it as text, which a pretrained language
    model reads well. A model trained from scratch has to learn what every number token means from few examples:
    on Meta-World push the tiny preset reached a lower loss in fewer steps, and a shorter prefix, with this.
    """

    def __init__(self, state_dim: int, hidden: int, tokens: int = 1):
        super().__init__()
        self.state_dim, self.hidden, self.tokens = int(state_dim), int(hidden), int(tokens)
        width = max(2 * hidden, 256)
        self.net = nn.Sequential(nn.Linear(state_dim, width), nn.GELU(), nn.Linear(width, hidden * tokens))

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        if state.shape[-1] != self.state_dim:
            raise ValueError(f"the state encoder reads {self.state_dim}-D states, got shape {tuple(state.shape)}")
        return self.net(state).reshape(len(state), self.tokens, self.hidden)


class SlotEmbedding(nn.Module):
    """Parallel decoding's query slots: one learned input embedding per action id of a chunk, ``[slots, hidden]``.

    Slot ``i`` reads the same vector for every sample; what it predicts comes from attending to the prefix and the
    other slots (the non-autoregressive recipe of Gu et al. 2018 with learned queries, as in DETR). Initialised at
    the scale of Gemma's (sqrt(hidden)-scaled) token embeddings.
    """

    def __init__(self, slots: int, hidden: int):
        super().__init__()
        self.slots, self.hidden = int(slots), int(hidden)
        self.weight = nn.Parameter(torch.randn(self.slots, self.hidden) * 0.02 * self.hidden**0.5)

    def forward(self, rows: int) -> torch.Tensor:
        """``[rows, slots, hidden]``: the slot embeddings for ``rows`` samples."""
        return self.weight[None].expand(rows, -1, -1)


class PrefixLM(nn.Module):
    """PaliGemma driven with an explicit prefix-LM mask. ``backbone`` is the transformers model, unchanged;
    ``state_encoder`` (optional) writes the state's embeddings into the prefix's state slots; ``slot_embedding``
    (optional, parallel decoding) writes the query slots' learned inputs."""

    def __init__(
        self,
        backbone: PaliGemmaForConditionalGeneration,
        state_encoder: StateEncoder | None = None,
        slot_embedding: SlotEmbedding | None = None,
    ):
        super().__init__()
        self.backbone = backbone
        self.state_encoder = state_encoder
        self.slot_embedding = slot_embedding

    @property
    def image_size(self) -> int:
        """Images are resized to this square size."""
        return int(self.backbone.config.vision_config.image_size)

    @property
    def image_tokens(self) -> int:
        """Image tokens per camera: one per patch (the keypoint encoder gives as many keypoints)."""
        return (self.image_size // int(self.backbone.config.vision_config.patch_size)) ** 2

    @property
    def vocab_size(self) -> int:
        return self.backbone.config.text_config.vocab_size

    @property
    def dtype(self) -> torch.dtype:
        return self.backbone.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.backbone.lm_head.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # --- the parts its lean path runs (vla.model.lean), named by their role -------------------------------------
    @property
    def text_model(self) -> nn.Module:
        """The Gemma decoder (its ``layers``, ``norm`` and ``rotary_emb``)."""
        return self.backbone.model.language_model

    @property
    def text_config(self):
        return self.backbone.config.text_config

    @property
    def image_token_id(self) -> int:
        return int(self.backbone.config.image_token_id)

    def token_embeddings(self) -> nn.Embedding:
        return self.backbone.get_input_embeddings()

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, N, 3, H, W]`` in [0, 1] -> ``[B * N, image_tokens, H]``: the vision tower's tokens, projected."""
        return self.backbone.model.get_image_features(self.pixel_values(images)).pooler_output

    def lean_steps(self, prompt: Sequence, max_new_tokens: int) -> LeanSteps:
        """The fast decoding path for ``prompt``: prefill, then one step per id on a static KV cache."""
        return LeanSteps(self, prompt, max_new_tokens)

    # --- inputs --------------------------------------------------------------------------------------------
    def pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, N, 3, H, W]`` floats in [0, 1] -> ``[B * N, 3, S, S]`` in [-1, 1] (SigLIP's range), resized to S."""
        b, n, c, h, w = images.shape
        x = images.reshape(b * n, c, h, w).to(self.device, self.dtype)
        if (h, w) != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True)
        return x * 2.0 - 1.0

    def additive_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """bool ``[B, Lq, Lk]`` -> float ``[B, 1, Lq, Lk]``: 0 where allowed, the dtype's minimum elsewhere.

        A finite minimum (not -inf) keeps fully masked rows (padding queries) finite: no NaN can reach real tokens.
        """
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        low = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        return torch.where(mask.to(self.device)[:, None], zero, low)

    # --- forward -------------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,  # long [B, Lq]
        mask: torch.Tensor,  # bool [B, Lq, Lk]; Lk = cached length + Lq
        position_ids: torch.Tensor,  # long [B, Lq]
        *,
        token_type_ids: torch.Tensor | None = None,  # long [B, Lq], 0 prefix / 1 suffix
        images: torch.Tensor | None = None,  # [B, N, 3, H, W] in [0, 1]; only with the image placeholders
        past_key_values=None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        state: torch.Tensor | None = None,  # float [B, S], normalised; read at state_slots only
        state_slots: torch.Tensor | None = None,  # bool [B, Lq], positions that take the state's embeddings
        query_slots: torch.Tensor | None = None,  # bool [B, Lq], parallel decoding's slots (learned embeddings)
    ):
        """Hidden states ``[B, Lq, hidden]`` (``.last_hidden_state``), and the KV cache when ``use_cache``."""
        placeholders = input_ids == self.backbone.config.image_token_id
        if images is None and past_key_values is None and bool(placeholders.any()):
            raise ValueError("the ids hold image placeholders but no images were given; pass images [B, N, 3, H, W]")
        if token_type_ids is None:
            token_type_ids = torch.ones_like(input_ids)
        inputs = {"input_ids": input_ids.to(self.device)}
        if _any(state_slots) or _any(query_slots):
            inputs = {"inputs_embeds": self.embed_inputs(input_ids, state, state_slots, query_slots)}
        return self.backbone.model(
            **inputs,
            pixel_values=None if images is None else self.pixel_values(images),
            attention_mask=self.additive_mask(mask),
            position_ids=position_ids.to(self.device),
            token_type_ids=token_type_ids.to(self.device),
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )

    def embed_inputs(
        self,
        input_ids: torch.Tensor,
        state: torch.Tensor | None,
        state_slots: torch.Tensor | None,
        query_slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token embeddings ``[B, L, hidden]`` with the state encoder's output written into the state slots and the
        slot embedding into the query slots (parallel decoding)."""
        embeds = self.backbone.get_input_embeddings()(input_ids.to(self.device))
        if _any(state_slots):
            if self.state_encoder is None:
                raise ValueError(
                    "the sequence has state slots but this model has no state encoder; build it with "
                    "state_tokens > 0 (VLAConfig.state_encoding='embedding')"
                )
            values = self.state_encoder(state.to(self.device, embeds.dtype))  # [B, k, hidden]
            embeds = _write(embeds, state_slots.to(self.device), values, "state")
        if _any(query_slots):
            if self.slot_embedding is None:
                raise ValueError(
                    "the sequence has query slots but this model has no slot embedding; build it with "
                    "query_slots > 0 (VLAConfig.decoding='parallel')"
                )
            embeds = _write(embeds, query_slots.to(self.device), self.slot_embedding(len(embeds)), "query")
        return embeds

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., hidden]`` -> ``[..., vocab]`` float32 logits (the tied LM head)."""
        return self.backbone.lm_head(hidden).float()

    # --- the two verbs -------------------------------------------------------------------------------------
    def loss(
        self, seq: Sequence, images: torch.Tensor | None = None, *, lean: bool | None = None, compiled: bool = False
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Next-token cross-entropy on the suffix only; logits are computed at those positions only. (Parallel
        decoding: each query slot's own action id, at every slot at once; the sequence's targets say which.)

        ``lean`` (None: wherever the backbone allows it, ``LeanSteps.supports``): the hidden states come from
        ``vla.model.lean.suffix_hidden``, the backbone's own layers as plain tensor ops with no work on padding and the last
        layer run only where the loss reads; ``False`` runs transformers' forward (the reference it is tested against).
        ``compiled``: those layers through torch.compile (``vla train --compile=true``; the first steps pay the
        compilation, ~40 s for tiny on a busy CPU with a warm inductor cache, minutes without).

        Metrics (0-d tensors, so nothing waits for the device until the caller reads them): ``loss``,
        ``accuracy`` (greedy next-token accuracy on the action ids), ``suffix_tokens``.
        """
        seq = seq.to(self.device)
        if lean is None:
            lean = LeanSteps.supports(self, training=True)
        if lean:
            hidden = suffix_hidden(self, seq, images, compiled)  # [N, hidden], N = suffix targets in the batch
        else:
            out = self(
                seq.input_ids,
                seq.attention_mask,
                seq.position_ids,
                token_type_ids=seq.token_type_ids,
                images=images,
                state=seq.state,
                state_slots=seq.state_slots,
                query_slots=seq.query_slots,
            )
            hidden = out.last_hidden_state[seq.loss_mask]  # [N, hidden], N = suffix targets in the batch
        logits = self.logits(hidden)  # [N, V]
        targets = seq.targets[seq.loss_mask]  # [N]
        loss = F.cross_entropy(logits, targets)
        with torch.no_grad():
            is_action = seq.action_mask[seq.loss_mask]
            hits = (logits.argmax(-1) == targets)[is_action]
            accuracy = hits.float().mean()  # NaN when the batch holds no action ids
        return loss, {
            "loss": loss.detach(),
            "accuracy": accuracy,
            "suffix_tokens": torch.tensor(float(targets.numel())),
        }


def _any(mask: torch.Tensor | None) -> bool:
    return mask is not None and bool(mask.any())


def _write(embeds: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, what: str) -> torch.Tensor:
    """``values`` ``[B, k, hidden]`` written, in order, at the ``k`` True positions of each row of ``slots``."""
    per_row = slots.sum(dim=1)
    if bool((per_row != values.shape[1]).any()):
        raise ValueError(f"every row needs {values.shape[1]} {what} slots, got {per_row.tolist()}")
    return embeds.masked_scatter(slots[..., None].expand_as(embeds), values.to(embeds.dtype))
