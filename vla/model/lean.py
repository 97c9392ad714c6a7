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

Training takes the same route: ``PrefixLM.loss`` gets the loss positions' hidden states from ``suffix_hidden``, the
same layers as differentiable tensor ops on the batch's valid tokens only (no work on padding), with the last layer's
MLP run only where the loss reads. ``PrefixLM.compile_training = True`` (``vla train --compile=true``) runs those
layers through ``torch.compile`` (inductor; shapes dynamic, so FAST's varying lengths do not recompile), and falls
back to the uncompiled layers, with a warning, where it cannot compile.
"""

from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F

from vla.model.sequence import Sequence

logger = logging.getLogger(__name__)


class LeanSteps:
    """The backbone's Gemma layers as plain tensor ops on a static KV cache: ``prefill(prompt, images)`` runs the
    prompt, then ``__call__(token, step)`` runs one new token per row (``token`` ``[B]``, the id sampled at ``step``);
    both return the last position's hidden state ``[B, hidden]`` after the final norm, as the backbone would.

    Built once per ``generate`` call: a key and a value buffer of ``Lp + max_new_tokens`` columns per layer, the
    additive mask over every column, and RoPE's cos/sin for every position a new token will take, so a step is
    about a dozen tensor ops per layer and allocates only its activations. Left padding puts every row's token
    ``step`` in the same column ``Lp + step``. For small models the q/k/v and gate/up projections run as one matrix
    product each (``_fused``: concatenated weights, cached per layer and rebuilt when a weight changes).
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
        # Gemma's RMSNorm is computed in float32 and scales by (1 + weight): fold the 1 in once (one F.rms_norm)
        self.eps = lm.norm.eps
        self.norm_weights = [
            (1.0 + layer.input_layernorm.weight.float(), 1.0 + layer.post_attention_layernorm.weight.float())
            for layer in self.layers
        ]
        self.final_norm_weight = 1.0 + lm.norm.weight.float()
        fused_bytes = sum(sum(p.numel() * p.element_size() for p in _projections(layer)) for layer in self.layers)
        self.weights = [_fused(layer) if fused_bytes <= self.FUSE_MAX_BYTES else None for layer in self.layers]
        # What one step reads per layer, looked up once (nn.Module attribute access costs more than a small op):
        # the norms' scales and the transposed projection weights for ``h @ w`` on [B, H] rows (q, k, v as one
        # product when fused, else three; gate and up likewise).
        self.plan = []
        for layer, (w_in, w_post), fused in zip(self.layers, self.norm_weights, self.weights):
            a, m = layer.self_attn, layer.mlp
            if fused is not None:
                qkv, gate_up = (fused[0].t(),), (fused[1].t(),)
            else:
                qkv = (a.q_proj.weight.t(), a.k_proj.weight.t(), a.v_proj.weight.t())
                gate_up = (m.gate_proj.weight.t(), m.up_proj.weight.t())
            self.plan.append((w_in, qkv, a.o_proj.weight.t(), w_post, gate_up, m.down_proj.weight.t(), a.scaling))
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
            type(lm).__name__ == "GemmaModel"
            and all(type(layer).__name__ == "GemmaDecoderLayer" for layer in layers)
            and all(getattr(p, "bias", None) is None for layer in layers for p in _linear_modules(layer))
            and type(lm.rotary_emb).__name__ == "GemmaRotaryEmbedding"
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
        cos, sin = self.rotary(x, prompt.position_ids.to(model.device))  # [B, Lp, hd]
        mask = model.additive_mask(prompt.attention_mask)  # [B, 1, Lp, Lp]: the prefix-LM mask
        if last:  # only the last columns go through the final norm (the slots' hidden states)
            return self.layers_forward(x, cos[:, None], _signed(sin)[:, None], mask, 0, last=last)
        return self.layers_forward(x, cos[:, None], _signed(sin)[:, None], mask, 0, last=1)[:, -1]

    def __call__(self, token: torch.Tensor, step: int) -> torch.Tensor:
        """``layers_forward`` for one token per row, written for ``[B, H]`` rows (no query axis, no transposes)."""
        b, col = len(token), self.lp + step
        n, half, nh, nkv, hd = col + 1, self.head_dim // 2, self.heads, self.kv_heads, self.head_dim
        cos, sin = self.cos[:, :, step], self.sin[:, :, step]  # [B, 1, hd]
        mask = self.mask[..., :n]  # [B, 1, 1, n]
        x = self.embed(token)  # [B, H], scaled by sqrt(H) as Gemma's embedding does
        for plan, keys, values in zip(self.plan, self.keys, self.values):
            w_in, w_qkv, w_o, w_post, w_gate_up, w_down, scale = plan
            h = self._norm(x, w_in)
            qkv = _matmul(h, w_qkv).view(b, nh + 2 * nkv, hd)  # [B, heads, hd]: queries, keys, values
            qk = qkv[:, : nh + nkv]
            qk = qk * cos + qk.roll(half, -1) * sin  # RoPE on queries and keys at once
            keys[:, :, col], values[:, :, col] = qk[:, nh:], qkv[:, nh + nkv :]
            o = F.scaled_dot_product_attention(
                qk[:, :nh, None], keys[:, :, :n], values[:, :, :n], attn_mask=mask, scale=scale, enable_gqa=True
            )  # [B, nh, 1, hd]
            x = x + o.reshape(b, nh * hd) @ w_o
            h = self._norm(x, w_post)
            gate, up = _matmul(h, w_gate_up).chunk(2, dim=-1)
            x = x + (F.gelu(gate, approximate="tanh") * up) @ w_down  # Gemma's gelu_pytorch_tanh
        return self._norm(x, self.final_norm_weight)

    def reorder(self, rows: torch.Tensor) -> None:
        """Row ``i`` takes row ``rows[i]``'s cache, mask and positions (beam search's survivors, ``[B]`` indices)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask, self.cos, self.sin = (t.index_select(0, rows) for t in (self.mask, self.cos, self.sin))

    def layers_forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, col: int, last: int = 0
    ):
        """``x`` ``[B, Lq, H]`` at cache columns ``col .. col + Lq - 1``, attending to the columns ``mask`` covers
        (``[B, 1, Lq, n]``, additive): the hidden states ``[B, Lq, H]`` after the final norm (only the last
        ``last`` positions' when ``last`` > 0). ``sin`` is signed (``_signed``), so RoPE is
        ``x * cos + roll(x, hd / 2) * sin``."""
        b, lq = x.shape[:2]
        n, half, nh, nkv = mask.shape[-1], self.head_dim // 2, self.heads, self.kv_heads
        for layer, keys, values, (w_in, w_post), fused in zip(
            self.layers, self.keys, self.values, self.norm_weights, self.weights
        ):
            a, m = layer.self_attn, layer.mlp
            h = self._norm(x, w_in)
            if fused is not None:  # one product for q, k and v: [B, Lq, (nh + 2 nkv) * hd] -> [B, heads, Lq, hd]
                qkv = F.linear(h, fused[0]).view(b, lq, nh + 2 * nkv, self.head_dim).transpose(1, 2)
                qk = qkv[:, : nh + nkv]
                qk = qk * cos + qk.roll(half, -1) * sin  # RoPE on queries and keys at once
                q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, nh + nkv :]
            else:
                q = F.linear(h, a.q_proj.weight).view(b, lq, nh, self.head_dim).transpose(1, 2)
                k = F.linear(h, a.k_proj.weight).view(b, lq, nkv, self.head_dim).transpose(1, 2)
                v = F.linear(h, a.v_proj.weight).view(b, lq, nkv, self.head_dim).transpose(1, 2)
                q, k = q * cos + q.roll(half, -1) * sin, k * cos + k.roll(half, -1) * sin
            keys[:, :, col : col + lq], values[:, :, col : col + lq] = k, v
            o = F.scaled_dot_product_attention(
                q, keys[:, :, :n], values[:, :, :n], attn_mask=mask, scale=a.scaling, enable_gqa=True
            )  # [B, nh, Lq, hd]
            x = x + F.linear(o.transpose(1, 2).reshape(b, lq, -1), a.o_proj.weight)
            h = self._norm(x, w_post)
            if fused is not None:
                gate, up = F.linear(h, fused[1]).chunk(2, dim=-1)
            else:
                gate, up = F.linear(h, m.gate_proj.weight), F.linear(h, m.up_proj.weight)
            x = x + F.linear(m.act_fn(gate) * up, m.down_proj.weight)
        return self._norm(x[:, -last:] if last else x, self.final_norm_weight)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], weight, self.eps)
        return F.rms_norm(x.float(), x.shape[-1:], weight, self.eps).to(x.dtype)


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
def suffix_hidden(model, seq: Sequence, images: torch.Tensor | None = None) -> torch.Tensor:
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
    if getattr(model, "compile_training", False):
        try:
            return _compiled_stack()(lm, x, rows, reads, cos, sin, mask)
        except Exception as err:  # noqa: BLE001 (no C++ compiler, an op inductor cannot lower, ...): run it eagerly
            model.compile_training = False
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
    half, heads = hd // 2, nh + 2 * nkv
    x = x.reshape(b * length, -1).index_select(0, rows)  # [N, H]
    cos = cos.reshape(b * length, 1, hd).index_select(0, rows)  # [N, 1, hd]
    sin = sin.reshape(b * length, 1, hd).index_select(0, rows)
    eps = lm.norm.eps
    for i, layer in enumerate(layers):
        a, m = layer.self_attn, layer.mlp
        h = _train_norm(x, layer.input_layernorm.weight, eps)
        qkv = F.linear(h, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])).view(-1, heads, hd)
        qk = qkv[:, : nh + nkv]
        qkv = torch.cat([qk * cos + qk.roll(half, -1) * sin, qkv[:, nh + nkv :]], dim=1)  # RoPE on q and k
        padded = qkv.new_zeros(b * length, heads, hd).index_copy(0, rows, qkv)  # [B * L, heads, hd]
        padded = padded.view(b, length, heads, hd).transpose(1, 2)  # [B, heads, L, hd]
        q, k, v = padded[:, :nh], padded[:, nh : nh + nkv], padded[:, nh + nkv :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a.scaling, enable_gqa=nkv != nh)
        o = o.transpose(1, 2).reshape(b * length, nh * hd).index_select(0, rows)  # [N, nh * hd]
        if i == len(layers) - 1:  # the last layer: only the positions the loss reads go on
            x, o = x.index_select(0, reads), o.index_select(0, reads)
        x = x + F.linear(o, a.o_proj.weight)
        h = _train_norm(x, layer.post_attention_layernorm.weight, eps)
        gate, up = F.linear(h, torch.cat([m.gate_proj.weight, m.up_proj.weight])).chunk(2, dim=-1)
        x = x + F.linear(m.act_fn(gate) * up, m.down_proj.weight)
    return _train_norm(x, lm.norm.weight, eps)


_COMPILED = []


def _compiled_stack():
    """``_packed_stack`` through ``torch.compile`` (inductor), built on first use; shapes are dynamic from the start, so
    batches of other lengths do not recompile."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(_packed_stack, dynamic=True))
    return _COMPILED[0]


def _train_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm (computed in float32, scaled by ``1 + weight``), differentiable in ``weight``."""
    return F.rms_norm(x.float(), x.shape[-1:], 1.0 + weight.float(), eps).to(x.dtype)


def _matmul(h: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``h @ w`` for one fused weight, or the outputs of several side by side."""
    return h @ weights[0] if len(weights) == 1 else torch.cat([h @ w for w in weights], dim=-1)


def _linear_modules(layer) -> tuple:
    a, m = layer.self_attn, layer.mlp
    return a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj


def _projections(layer) -> tuple[torch.Tensor, ...]:
    """The weights ``_fused`` concatenates: q, k, v, then gate, up."""
    a, m = layer.self_attn, layer.mlp
    return a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, m.gate_proj.weight, m.up_proj.weight


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> (weights' identity and version, tensors)


def _fused(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_qkv, w_gate_up)``: the layer's q/k/v and gate/up weights stacked along the output dimension, cached until
    one of them is replaced or changed in place (an optimiser step or ``load_state_dict`` bumps its version)."""
    weights = _projections(layer)
    key = tuple((w.data_ptr(), w._version) for w in weights)
    hit = _FUSED.get(layer)
    if hit is None or hit[0] != key:
        with torch.no_grad():
            hit = (key, (torch.cat(weights[:3]).detach(), torch.cat(weights[3:]).detach()))
        _FUSED[layer] = hit
    return hit[1]


def _signed(sin: torch.Tensor) -> torch.Tensor:
    """RoPE's ``rotate_half(x) * sin`` is ``roll(x, hd / 2) * [-sin_1, sin_2]``: one op instead of four, the same
    numbers (negation is exact)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
