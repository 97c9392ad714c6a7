"""The lean decoding loop: prefill and one-token steps of a PaliGemma/Gemma backbone as plain tensor ops.

``vla.model.decode.generate(..., lean=True)`` (the default with the KV cache) runs the prefill and every step here instead
of transformers' forward: the backbone's own Gemma layers and weights as plain ``F.linear`` / ``@`` / ``F.rms_norm`` /
``scaled_dot_product_attention`` calls on a static KV cache (buffers sized for the prompt plus ``max_new_tokens``,
the mask and RoPE tables computed once per call), with q/k/v and gate/up each one matrix product for small models.
transformers' per-call machinery (mask builders, the dynamic cache, output capturing, module hooks) was most of a
``tiny`` step: ~5 ms of framework around well under 1 ms of arithmetic. Small phases (every one of the ``tiny``
preset's) run on one CPU thread (``LeanSteps.SINGLE_THREAD_MACS``). The ids equal the other two paths'
(``tests/test_decode.py``, greedy and sampled); backbones that are not plain Gemma take transformers' path, and
``lean=False`` forces it (the baseline of ``scripts/bench_decode.py``).

The layers are written once, ``gemma_layers``, over token rows; what differs between training, the prefill and a
step is only how a layer's rows attend (``attend``: a packed batch in its padded sequences, a prompt writing the KV
cache, one token per row reading it) and where the weights come from (``layer_weights``). Training takes the same
route: ``PrefixLM.loss`` gets the loss positions' hidden states from ``suffix_hidden``, the layers as differentiable
tensor ops on the batch's valid tokens only (no work on padding), with the last layer's MLP run only where the loss
reads. ``compiled=True`` (``PrefixLM.loss``, ``VLAPolicy.forward``; ``vla train --compile=true``) runs those
layers through ``torch.compile`` (inductor; shapes dynamic, so FAST's varying lengths do not recompile), and falls
back to the uncompiled layers, with a warning, where it cannot compile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.gemma.modeling_gemma import GemmaDecoderLayer, GemmaModel, GemmaRotaryEmbedding

from vla.model.sequence import Sequence

logger = logging.getLogger(__name__)
COMPILE_FAILED = "_compile_failed"  # set on a model whose layers torch.compile could not compile


class LeanSteps:
    """The backbone's Gemma layers as plain tensor ops on a static KV cache: ``prefill(prompt, images)`` runs the
    prompt, then ``__call__(token, step)`` runs one new token per row (``token`` ``[B]``, the id sampled at ``step``);
    both return the last position's hidden state ``[B, hidden]`` after the final norm, as the backbone would.

    Built once per ``generate`` call: a key and a value buffer of ``Lp + max_new_tokens`` columns per layer, the
    additive mask over every column, and RoPE's cos/sin for every position a new token will take, so a step is
    about a dozen tensor ops per layer and allocates only its activations. Left padding puts every row's token
    ``step`` in the same column ``Lp + step``. For small models the q/k/v and gate/up projections run as one matrix
    product each (``_fused``: concatenated weights, stacked once per call).
    """

    # A phase (the prefill, or one step) whose largest matrix product is below this many multiply-adds runs on one
    # CPU thread: its small ops gain little from being split, and splitting costs a fork-join per op; on a busy
    # machine, a wait for a descheduled thread (a tiny-preset projection: 18 us on one thread, 2-4 ms on two, measured
    # on 2 shared cores). Every phase of the tiny preset is below it; the 3B shape is always above.
    SINGLE_THREAD_MACS = 1 << 23
    FUSE_MAX_BYTES = 64 * 2**20  # fused copies of the projections are kept only while they cost less than this

    def __init__(self, model, prompt: Sequence, max_new_tokens: int):
        lm = model.text_model
        b, lp = prompt.input_ids.shape
        self.model = model
        self.embed = model.token_embeddings()
        self.rotary = lm.rotary_emb
        self.layers = list(lm.layers)
        self.heads, self.kv_heads = lm.config.num_attention_heads, lm.config.num_key_value_heads
        self.head_dim = self.layers[0].self_attn.head_dim
        self.eps = lm.norm.eps
        fused_bytes = sum(sum(p.numel() * p.element_size() for p in _projections(layer)) for layer in self.layers)
        # What a layer reads, looked up once (nn.Module attribute access costs more than a small op): the norms' scales
        # with Gemma's 1 folded in, and q/k/v and gate/up as one product each for small models (``_fused``).
        self.weights = [layer_weights(layer, fused=fused_bytes <= self.FUSE_MAX_BYTES) for layer in self.layers]
        self.final_norm_weight = 1.0 + lm.norm.weight.float()
        self.lp = lp
        device, dtype = model.device, model.dtype
        self.keys = [
            torch.empty(b, self.kv_heads, lp + max_new_tokens, self.head_dim, device=device, dtype=dtype)
            for _ in self.layers
        ]
        self.values = [torch.empty_like(k) for k in self.keys]
        valid = torch.cat([prompt.valid.to(device), torch.ones(b, max_new_tokens, dtype=torch.bool, device=device)], 1)
        self.mask = model.additive_mask(valid[:, None, :])  # [B, 1, 1, Lp + N]: every column a new token may see
        positions = (prompt.position_ids[:, -1:] + 1).to(device) + torch.arange(max_new_tokens, device=device)
        cos, sin = self.rotary(self.keys[0], positions)  # [B, N, hd] each (the module reads only dtype and device)
        self.cos, self.sin = cos[:, None], _signed(sin)[:, None]  # [B, 1, N, hd]

    @staticmethod
    def supports(model, training: bool = False) -> bool:
        """Plain Gemma layers without biases (PaliGemma 1 and every preset here) and default RoPE, in eval mode
        (``training=True``: in either mode, for ``suffix_hidden``); anything else takes the transformers path
        (Gemma 2's soft-capping and sliding windows are not written here)."""
        try:
            lm = model.text_model
            layers = list(lm.layers)
        except AttributeError:
            return False
        rope = (getattr(lm.config, "rope_parameters", None) or {}).get("rope_type", "default")
        act = getattr(lm.config, "hidden_activation", None) or getattr(lm.config, "hidden_act", None)
        return (
            type(lm) is GemmaModel  # exactly: a subclass (Gemma 2's) may change the layer
            and all(type(layer) is GemmaDecoderLayer for layer in layers)
            and all(getattr(p, "bias", None) is None for layer in layers for p in _linear_modules(layer))
            and type(lm.rotary_emb) is GemmaRotaryEmbedding
            and rope == "default"
            and act == "gelu_pytorch_tanh"
            and float(getattr(lm.config, "attention_dropout", 0.0) or 0.0) == 0.0
            and (training or not lm.training)
        )

    @staticmethod
    def threads_for(model, rows: int) -> int | None:
        """Intra-op threads for a lean phase over ``rows`` token rows on ``model``'s device (None: torch's setting)."""
        if model.device.type != "cpu" or torch.get_num_threads() == 1:
            return None
        text = model.text_config
        return 1 if rows * text.hidden_size * text.intermediate_size <= LeanSteps.SINGLE_THREAD_MACS else None

    def prefill(self, prompt: Sequence, images: torch.Tensor | None, last: int = 0) -> torch.Tensor:
        """The prompt through the layers (images, state and query slots embedded as ``PrefixLM.forward`` does),
        filling cache columns ``0 .. Lp - 1``: the last position's hidden state ``[B, H]``, or with ``last`` > 0 the
        last ``last`` positions' ``[B, last, H]`` (parallel decoding's slots: its one pass)."""
        model = self.model
        x = embed_sequence(model, prompt, images)  # [B, Lp, H]
        b, lq, hidden = x.shape
        cos, sin = self.rotary(x, prompt.position_ids.to(model.device))  # [B, Lp, hd]
        mask = model.additive_mask(prompt.attention_mask)  # [B, 1, Lp, Lp]: the prefix-LM mask
        nh, nkv, hd = self.heads, self.kv_heads, self.head_dim

        def attend(i: int, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # [B * Lp, ., hd] -> [B * Lp, nh * hd]
            qk, v = qk.view(b, lq, -1, hd).transpose(1, 2), v.view(b, lq, -1, hd).transpose(1, 2)  # [B, ., Lp, hd]
            q, k = qk[:, :nh], qk[:, nh:]
            self.keys[i][:, :, :lq], self.values[i][:, :, :lq] = k, v
            o = F.scaled_dot_product_attention(
                q,
                self.keys[i][:, :, :lq],
                self.values[i][:, :, :lq],
                attn_mask=mask,
                scale=self.weights[i].scale,
                enable_gqa=True,
            )
            return o.transpose(1, 2).reshape(b * lq, nh * hd)

        rows = gemma_layers(
            x.reshape(b * lq, hidden),
            self.weights,
            _rows(cos, hd),
            _rows(_signed(sin), hd),
            attend,
            (nh, nkv, hd),
            self.eps,
            self.final_norm_weight,
        ).view(b, lq, hidden)  # every position through every layer: the numbers do not depend on how many are read
        return rows[:, -last:] if last else rows[:, -1]  # [B, last, H] or [B, H]

    def __call__(self, token: torch.Tensor, step: int) -> torch.Tensor:
        """One token per row (``[B]``, the ids sampled at ``step``) through the layers at cache column ``Lp + step``:
        the hidden state ``[B, H]`` after the final norm."""
        b, col = len(token), self.lp + step
        n, nh, nkv, hd = col + 1, self.heads, self.kv_heads, self.head_dim
        mask = self.mask[..., :n]  # [B, 1, 1, n]

        def attend(i: int, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # [B, ., hd] -> [B, nh * hd]
            q, keys, values = qk[:, :nh], self.keys[i], self.values[i]
            keys[:, :, col], values[:, :, col] = qk[:, nh:], v
            o = F.scaled_dot_product_attention(
                q[:, :, None],
                keys[:, :, :n],
                values[:, :, :n],
                attn_mask=mask,
                scale=self.weights[i].scale,
                enable_gqa=True,
            )  # [B, nh, 1, hd]
            return o.reshape(b, nh * hd)

        x = self.embed(token)  # [B, H], scaled by sqrt(H) as Gemma's embedding does
        cos, sin = self.cos[:, :, step], self.sin[:, :, step]  # [B, 1, hd]
        return gemma_layers(x, self.weights, cos, sin, attend, (nh, nkv, hd), self.eps, self.final_norm_weight)

    def reorder(self, rows: torch.Tensor) -> None:
        """Row ``i`` takes row ``rows[i]``'s cache, mask and positions (beam search's survivors, ``[B]`` indices)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask, self.cos, self.sin = (t.index_select(0, rows) for t in (self.mask, self.cos, self.sin))


# --- the layers: written once, for training, the prefill and each step ------------------------------------------------
@dataclass(frozen=True)
class LayerWeights:
    """What one Gemma layer reads: its norms' scales (``1 + weight``, float32), the q/k/v and gate/up projections (one
    fused ``[out, H]`` matrix each, or the separate ones) and the rest as the layer holds them."""

    norm_in: torch.Tensor
    qkv: tuple[torch.Tensor, ...]
    o: torch.Tensor
    norm_post: torch.Tensor
    gate_up: tuple[torch.Tensor, ...]
    down: torch.Tensor
    scale: float  # attention's 1 / sqrt(head_dim) (or the model's query_pre_attn_scalar)


def layer_weights(layer, fused: bool, training: bool = False) -> LayerWeights:
    """``layer``'s ``LayerWeights``: for training differentiable (norm scales and stacked projections computed from the
    parameters at each call), for decoding the norm scales computed once and, with ``fused``, the stacked projections
    cached (``_fused``)."""
    a, m = layer.self_attn, layer.mlp
    if training:
        qkv, gate_up = (
            (torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),),
            (torch.cat([m.gate_proj.weight, m.up_proj.weight]),),
        )
    elif fused:
        qkv, gate_up = ((w,) for w in _fused(layer))
    else:
        qkv, gate_up = (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight), (m.gate_proj.weight, m.up_proj.weight)
    return LayerWeights(
        norm_in=1.0 + layer.input_layernorm.weight.float(),
        qkv=qkv,
        o=a.o_proj.weight,
        norm_post=1.0 + layer.post_attention_layernorm.weight.float(),
        gate_up=gate_up,
        down=m.down_proj.weight,
        scale=a.scaling,
    )


def gemma_layers(
    x,
    weights: list[LayerWeights],
    cos,
    sin,
    attend,
    heads: tuple[int, int, int],
    eps: float,
    final_norm: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gemma's decoder layers and final norm on token rows: ``x`` ``[N, H]``, RoPE's ``cos`` and signed ``sin``
    (``_signed``) ``[N, 1, hd]``, ``heads`` = (query heads, key/value heads, head_dim). ``attend(i, qkv)`` is layer
    ``i``'s attention over the queries and keys ``qk`` ``[N, nh + nkv, hd]`` (RoPE applied) and the values ``v``
    ``[N, nkv, hd]``: how the rows sit in their
    sequences and what they see (a packed batch, a prompt writing the KV cache, one token reading it) -> ``[N, nh *
    hd]``. ``keep`` (``[M]`` rows): only these go on after the last layer's attention (nothing after it reaches
    another row), so the result is ``[M, H]``. The arithmetic is transformers' Gemma layer's."""
    nh, nkv, hd = heads
    half = hd // 2
    for i, w in enumerate(weights):
        h = _rms_norm(x, w.norm_in, eps)
        qkv = _project(h, w.qkv).view(-1, nh + 2 * nkv, hd)
        qk = qkv[:, : nh + nkv]
        o = attend(i, qk * cos + qk.roll(half, -1) * sin, qkv[:, nh + nkv :])  # RoPE on q and k at once
        if keep is not None and i == len(weights) - 1:
            x, o = x.index_select(0, keep), o.index_select(0, keep)
        x = x + F.linear(o, w.o)
        h = _rms_norm(x, w.norm_post, eps)
        gate, up = _project(h, w.gate_up).chunk(2, dim=-1)
        x = x + F.linear(F.gelu(gate, approximate="tanh") * up, w.down)  # Gemma's gelu_pytorch_tanh
    return _rms_norm(x, final_norm, eps)


def _rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm, computed in float32, by ``scale`` = ``1 + weight``."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], scale, eps)
    return F.rms_norm(x.float(), x.shape[-1:], scale, eps).to(x.dtype)


def _project(h: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``h`` through one stacked projection, or several whose outputs sit side by side."""
    return F.linear(h, weights[0]) if len(weights) == 1 else torch.cat([F.linear(h, w) for w in weights], dim=-1)


def _rows(t: torch.Tensor, hd: int) -> torch.Tensor:
    """``[B, L, hd]`` -> ``[B * L, 1, hd]``: a table per token row."""
    return t.reshape(-1, 1, hd)


def embed_sequence(model, seq: Sequence, images: torch.Tensor | None) -> torch.Tensor:
    """``[B, L, H]`` input embeddings of ``seq`` as ``PrefixLM.forward`` builds them: token embeddings (Gemma's, scaled
    by sqrt(H)), the state encoder's and the query slots' where the sequence marks them, the image features at the
    placeholders."""
    ids = seq.input_ids.to(model.device)
    embed = model.token_embeddings()
    image_id = model.image_token_id
    placeholders = ids == image_id
    if bool(seq.state_slots.any()) or bool(seq.query_slots.any()):
        x = model.embed_inputs(ids, seq.state, seq.state_slots, seq.query_slots)
    else:
        x = embed(ids.masked_fill(placeholders, 0) if image_id >= embed.num_embeddings else ids)
    if images is not None:
        features = model.image_features(images)
        if features.shape[0] * features.shape[1] != int(placeholders.sum()):
            raise ValueError(
                f"{int(placeholders.sum())} image placeholders for {features.shape[0]} images of "
                f"{features.shape[1]} tokens; build the prompt for as many cameras as images"
            )
        x = x.masked_scatter(placeholders[..., None].expand_as(x), features.to(x.dtype))
    elif bool(placeholders.any()):
        raise ValueError("the ids hold image placeholders but no images were given; pass images [B, N, 3, H, W]")
    return x


# --- training: the loss positions' hidden states, no work on padding ------------------------------------------------
def suffix_hidden(model, seq: Sequence, images: torch.Tensor | None = None, compiled: bool = False) -> torch.Tensor:
    """The final hidden states ``[M, H]`` at the ``M`` positions of ``seq.loss_mask`` (row-major, as
    ``last_hidden_state[seq.loss_mask]`` orders them), computed with the backbone's own weights and differentiable,
    doing no work on padding.

    The projections, norms and MLPs run on the ``N`` valid tokens of the batch packed into one ``[N, H]`` matrix (a
    right-padded FAST batch is 20-30% padding); attention alone sees the padded ``[B, heads, L, hd]`` layout and the
    prefix-LM mask (its scores are a small share of a step). The last layer's attention output, MLP and the final norm
    run only where the loss reads (the suffix, a third of the tokens): nothing after the last attention reaches any
    other position. The arithmetic is transformers' Gemma layer's (``tests/test_model.py`` compares the loss and
    every gradient); only the order of some sums differs.
    """
    lm = model.text_model
    x = embed_sequence(model, seq, images)  # [B, L, H]
    valid = seq.valid.to(model.device).reshape(-1)
    rows = valid.nonzero().squeeze(1)  # [N]: the valid tokens of the flattened [B * L] batch
    # [M]: where the loss positions sit among the valid ones (every loss position is a valid token)
    reads = seq.loss_mask.to(model.device).reshape(-1)[rows].nonzero().squeeze(1)
    cos, sin = lm.rotary_emb(x, seq.position_ids.to(model.device))  # [B, L, hd]
    mask = model.additive_mask(seq.attention_mask)  # [B, 1, L, L]
    sin = _signed(sin)
    if compiled and not getattr(model, COMPILE_FAILED, False):
        try:
            return _compiled_stack()(lm, x, rows, reads, cos, sin, mask)
        except Exception as err:  # noqa: BLE001 (no C++ compiler, an op inductor cannot lower, ...): run it eagerly
            setattr(model, COMPILE_FAILED, True)  # remembered: not tried again every step
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            logger.warning(
                "torch.compile could not compile the training step (%s: %s); training goes on without it "
                "(the same arithmetic, uncompiled)",
                type(err).__name__,
                reason,
            )
    return _packed_stack(lm, x, rows, reads, cos, sin, mask)


def _packed_stack(lm, x, rows, reads, cos, sin, mask):
    """``suffix_hidden``'s layers: ``x`` ``[B, L, H]`` embeddings, ``rows`` ``[N]`` valid tokens, ``reads`` ``[M]`` loss
    positions among them, RoPE's ``cos`` and signed ``sin`` ``[B, L, hd]``, the additive mask ``[B, 1, L, L]``."""
    b, length = x.shape[:2]
    nh, nkv = lm.config.num_attention_heads, lm.config.num_key_value_heads
    layers = list(lm.layers)
    hd = layers[0].self_attn.head_dim
    weights = [layer_weights(layer, fused=True, training=True) for layer in layers]

    def attend(
        i: int, qk: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:  # the packed rows in their sequences, and back
        qkv = torch.cat([qk, v], dim=1)
        padded = qkv.new_zeros(b * length, nh + 2 * nkv, hd).index_copy(0, rows, qkv)  # [B * L, heads, hd]
        padded = padded.view(b, length, -1, hd).transpose(1, 2)  # [B, heads, L, hd]
        q, k, v = padded[:, :nh], padded[:, nh : nh + nkv], padded[:, nh + nkv :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=weights[i].scale, enable_gqa=nkv != nh)
        return o.transpose(1, 2).reshape(b * length, nh * hd).index_select(0, rows)  # [N, nh * hd]

    x = x.reshape(b * length, -1).index_select(0, rows)  # [N, H]
    cos, sin = (t.reshape(b * length, 1, hd).index_select(0, rows) for t in (cos, sin))  # [N, 1, hd]
    final = 1.0 + lm.norm.weight.float()
    return gemma_layers(x, weights, cos, sin, attend, (nh, nkv, hd), lm.norm.eps, final, keep=reads)


_COMPILED = []


def _compiled_stack():
    """``_packed_stack`` through ``torch.compile`` (inductor), built on first use; shapes are dynamic from the start, so
    batches of other lengths do not recompile."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(_packed_stack, dynamic=True))
    return _COMPILED[0]


def _linear_modules(layer) -> tuple:
    a, m = layer.self_attn, layer.mlp
    return a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj


def _projections(layer) -> tuple[torch.Tensor, ...]:
    """The weights ``_fused`` concatenates: q, k, v, then gate, up."""
    a, m = layer.self_attn, layer.mlp
    return a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, m.gate_proj.weight, m.up_proj.weight


def _fused(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_qkv, w_gate_up)``: the layer's q/k/v and gate/up weights stacked along the output dimension, built anew for
    each decoding call (``LeanSteps``), so that they are always the weights as they are now (an optimiser step between
    two held-out measurements changes them in place)."""
    weights = _projections(layer)
    with torch.no_grad():
        return torch.cat(weights[:3]).detach(), torch.cat(weights[3:]).detach()


def _signed(sin: torch.Tensor) -> torch.Tensor:
    """RoPE's ``rotate_half(x) * sin`` is ``roll(x, hd / 2) * [-sin_1, sin_2]``: one op instead of four, the same
    numbers (negation is exact)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
