"""The backbone's sizes: named presets (``PRESETS``: ``micro`` for tests, ``tiny`` for a laptop CPU, ``small`` ~50M
for a GPU, ``paligemma-3b`` the real shape) and the transformers ``PaliGemmaConfig`` one of them gives for a
vocabulary, an image size and a number of cameras."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PaliGemmaConfig

from vla.model.vocab import VocabMap
from vla.names import check_name


@dataclass(frozen=True)
class ModelPreset:
    """One size of the backbone. Gemma decoder (text) and SigLIP encoder (vision) shapes."""

    hidden_size: int  # Gemma width; the image projector maps SigLIP features to it
    intermediate_size: int  # Gemma MLP width
    num_layers: int
    num_heads: int
    num_kv_heads: int  # 1 = multi-query attention, as in Gemma 2B
    head_dim: int
    vision_hidden_size: int
    vision_intermediate_size: int
    vision_layers: int
    vision_heads: int
    patch_size: int
    image_size: int  # default input resolution; images are resized to it
    max_positions: int = 8192

    def image_tokens(self, image_size: int | None = None) -> int:
        """Image tokens per camera: one per patch."""
        return ((image_size or self.image_size) // self.patch_size) ** 2


PRESETS: dict[str, ModelPreset] = {
    # tests only: a few hundred thousand parameters, untrained it is a random-token source
    "micro": ModelPreset(32, 64, 1, 2, 1, 16, 32, 64, 1, 2, 16, 32),
    # ~2M parameters (+ embeddings): trains at a useful speed on 2 CPU cores; 64 px -> 16 image tokens
    "tiny": ModelPreset(128, 512, 3, 4, 1, 32, 128, 256, 2, 4, 16, 64),
    # ~40M parameters: 96 px -> 36 image tokens per camera
    "small": ModelPreset(512, 2048, 8, 8, 1, 64, 384, 1536, 6, 6, 16, 96),
    # PaliGemma-3B (pt-224): Gemma 2B + SigLIP So400m/14; load weights with pretrained_path
    "paligemma-3b": ModelPreset(2048, 16384, 18, 8, 1, 256, 1152, 4304, 27, 16, 14, 224),
}


def get_preset(preset: str | ModelPreset) -> ModelPreset:
    if isinstance(preset, ModelPreset):
        return preset
    return PRESETS[check_name("model preset", preset, PRESETS)]


def paligemma_config(
    preset: ModelPreset, vocab: VocabMap, *, image_size: int | None = None, num_cameras: int = 1
) -> PaliGemmaConfig:
    """A ``PaliGemmaConfig`` for ``preset`` over ``vocab``.

    Without cameras the vision tower is never run, so it is shrunk to one small layer rather than carried at
    full size (PaliGemma always builds one).
    """
    size = image_size or preset.image_size
    if size % preset.patch_size:
        raise ValueError(
            f"image_size {size} is not a multiple of the patch size {preset.patch_size}; use e.g. "
            f"{size - size % preset.patch_size or preset.patch_size}"
        )
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=preset.vision_hidden_size,
        intermediate_size=preset.vision_intermediate_size,
        num_hidden_layers=preset.vision_layers,
        num_attention_heads=preset.vision_heads,
        image_size=size,
        patch_size=preset.patch_size,
        vision_use_head=False,  # PaliGemma uses the patch features, not the pooled head
    )
    if num_cameras == 0:
        vision.update(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1)
    text = dict(
        model_type="gemma",
        vocab_size=vocab.model_vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        head_dim=preset.head_dim,
        max_position_embeddings=preset.max_positions,
        pad_token_id=vocab.text.pad_id,
        bos_token_id=vocab.text.bos_id,
        eos_token_id=vocab.text.eos_id,
    )
    return PaliGemmaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=vocab.text.image_id,
        vocab_size=vocab.model_vocab_size,
        projection_dim=preset.hidden_size,
        hidden_size=preset.hidden_size,
    )
