"""Batched decoding: prefill the prompt once, then one token per step from the KV cache, under the constraint.

    gen = generate(model, prompt, vocab=vocab, constraint=tok.constraint(T, D), images=images,
                   max_new_tokens=c.max_length + 1, temperature=0.0)
    out = gen.decode(tok, T, D)          # DecodeResult: actions [B, T, D], valid [B] (generation and tokenizer)

At every step the tokenizer's constraint (an automaton over action ids, ``action_tokenizers.Constraint``) is
lifted to the model's vocabulary (``VocabConstraint``): while it is not done only the action ids it allows are
possible; once done only ``"|"`` is, so every finished row decodes to exactly ``[T, D]``. Masks are cached
per automaton state, so after warm-up the constraint costs a dictionary look-up and a ``masked_fill`` per step.
With ``constraint=None`` decoding is free (the ablation): any id but the image placeholder (an input-only
token PaliGemma would try to fill with image features) may come; rows stop at ``"|"``/EOS or after
``max_new_tokens``, and any non-action id or missing stop makes the row invalid (reported, never hidden).

``use_cache=False`` recomputes the whole sequence (images included) at every step: the reference that the cached
path must match id for id (``tests/test_decode.py``), and the baseline of ``scripts/bench_decode.py``.

With the cache, ``lean=True`` (the default) runs the prefill and every step through ``vla.model.lean.LeanSteps``
(the backbone's Gemma layers as plain tensor ops on a static KV cache); ``lean=False`` forces transformers' forward.

One-pass decoding (a prompt with query slots, ``SequenceLayout(decoding="parallel")``): one forward pass gives the
logits of every slot at once; the ids are then picked slot by slot under the constraint (each slot's mask is the
automaton's after the ids picked before it: no model call, so the chunk is as valid as a step-by-step one).
``fixed_chunk_length`` says whether a tokenizer's constraint allows that: every chunk exactly ``n`` ids.

Beam search (``num_beams=K`` > 1, greedy's generalisation): each row is copied K times, the K most probable partial
chunks (summed log-probabilities under the constraint) are kept at every step, the KV cache follows the surviving
hypotheses, and the most probable finished chunk is returned. ``num_beams=1`` is greedy, id for id. The policy is
trained on one id sequence per chunk (the tokenizer's own encoding; BPE could spell a FAST chunk other ways, which
training never shows), so the most probable sequence stands for the most probable chunk and no length penalty is
applied (a variable-length FAST chunk is scored like a fixed-length one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from action_tokenizers import ActionTokenizer, Constraint, DecodeResult

from vla.model.lean import LeanSteps
from vla.model.sequence import Sequence, prefix_lm_mask
from vla.model.vocab import VocabMap
from vla.model.vocab_constraint import VocabConstraint, fixed_chunk_length


@dataclass
class Generation:
    """What ``generate`` produced, per row. ``ids`` are action-tokenizer ids (the stop token removed)."""

    ids: list[list[int]]
    tokens: torch.Tensor  # long [B, steps]: the raw model ids, pad after a row stopped
    finished: np.ndarray  # bool [B]: the row emitted "|" or EOS
    valid: np.ndarray  # bool [B]: finished, and only action ids before the stop
    errors: list[str | None] = field(default_factory=list)
    steps: int = 0  # tokens generated for the longest row (forward passes after the prefill)
    # float [B]: each row's ids (and its stop) summed log-probability under the model with the constraint's masks, at
    # temperature 1 whatever was sampled: how sure the model was of the whole chunk (beam search maximises it)
    log_prob: np.ndarray | None = None

    @property
    def tokens_per_chunk(self) -> np.ndarray:
        return np.array([len(r) for r in self.ids])

    def decode(self, tokenizer: ActionTokenizer, time_horizon: int, action_dim: int) -> DecodeResult:
        """Chunks ``[B, T, D]`` (normalised) with validity = generation valid and tokenizer-decodable.

        Invalid rows are NaN (the tokenizer's ``mark`` mode); the caller decides the fallback.
        """
        out = tokenizer.decode(self.ids, time_horizon=time_horizon, action_dim=action_dim, mode="mark")
        valid = out.valid & self.valid
        errors = [g or t for g, t in zip(self.errors, out.errors)]
        actions = out.actions.copy()
        actions[~valid] = np.nan
        return DecodeResult(actions=actions, valid=valid, errors=errors)


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """``[B, V]`` logits (masked ids at -inf) -> ``[B]`` ids. Greedy at temperature 0, else nucleus sampling.

    Sampling inverts the cumulative distribution at one uniform draw per row (``torch.multinomial`` is several
    times slower for a single draw over a large batch).
    """
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # keep the smallest head whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    cdf = probs.cumsum(dim=-1)  # [B, V]
    device = generator.device if generator is not None else probs.device
    u = torch.rand(len(probs), 1, generator=generator, device=device).to(probs.device) * cdf[:, -1:]
    picked = torch.searchsorted(cdf, u, right=True).squeeze(-1)  # first id whose cdf exceeds u: never a 0-prob id
    picked = picked.clamp(max=probs.shape[-1] - 1)
    # A row whose logits held NaN or inf has no distribution (the caller marks it invalid), and a cumulative sum
    # rounded unevenly could land on a 0-probability id: either takes the greedy id, which the mask allows.
    fallback = ~torch.isfinite(cdf[:, -1]) | (probs.gather(1, picked[:, None]).squeeze(1) <= 0)
    return torch.where(fallback, logits.argmax(dim=-1), picked)


@torch.inference_mode()
def generate(
    model,
    prompt: Sequence,
    *,
    vocab: VocabMap,
    constraint: Constraint | VocabConstraint | None = None,
    images: torch.Tensor | None = None,
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    lean: bool = True,
    num_beams: int = 1,
    trace: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
    forced: list[list[int]] | None = None,
) -> Generation:
    """Generate action ids after a left-padded ``prompt`` (``SequenceLayout.build_prefix``) for every row.

    ``model``: a ``vla.model.prefix_lm.PrefixLM``. ``constraint``: the tokenizer's (lifted here) or ``None`` for free decoding.
    ``max_new_tokens``: defaults to the constraint's ``max_length + 1`` (room for ``"|"``); required without one.
    Each row stops at ``"|"``/EOS; decoding ends when every row has stopped or after ``max_new_tokens`` steps.
    ``lean``: with the cache, run the steps after the prefill through ``LeanSteps`` where the backbone allows it.
    A prompt with query slots (parallel decoding) is decoded in one forward pass (``steps`` = 1).
    ``num_beams``: > 1 runs beam search with that many hypotheses per row (greedy, so ``temperature`` must be 0).
    ``trace(step, logits, token)``: called at every step (a parallel prompt: every slot, in the order its ids are
    picked) with the ``[B, V]`` logits after the constraint's mask (-inf where an id may not come) and the ``[B]``
    ids chosen; ``vla inspect`` draws its decoding steps from it. Not with beam search.
    ``forced``: per row, the action ids its chunk must begin with (committed-prefix decoding: the ids of the actions
    that will run before the chunk arrives, ``ActionTokenizer.prefix_ids``); each is taken in turn whatever the
    model prefers, so what follows is decoded knowing them. They must be ids the constraint allows there.
    """
    vc = VocabConstraint(constraint, vocab) if isinstance(constraint, Constraint) else constraint
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be a positive integer (1 = greedy), got {num_beams!r}")
    parallel = bool(prompt.query_slots.any())
    if num_beams > 1 and (temperature > 0 or parallel):
        raise ValueError(
            "beam search (num_beams > 1) keeps the most probable chunks, so it needs temperature 0 and step-by-step "
            f"decoding; got temperature {temperature}" + (" and a parallel prompt (query slots)" if parallel else "")
        )
    if trace is not None and num_beams > 1:
        raise ValueError("trace follows one hypothesis per row; use num_beams=1 with it")
    forced_ids = _forced(forced, vocab, len(prompt), num_beams, model.device)
    if parallel:  # parallel decoding: one forward pass, whatever max_new_tokens says
        return _decode_parallel(
            model, prompt, vocab, vc, images, temperature, top_p, generator, lean, trace, forced_ids
        )
    if max_new_tokens is None:
        if vc is None:
            raise ValueError("max_new_tokens is required without a constraint (e.g. the constraint's max_length + 1)")
        max_new_tokens = vc.max_length + 1
    if vc is not None and max_new_tokens < vc.max_length + 1:
        raise ValueError(
            f"max_new_tokens {max_new_tokens} can cut constrained chunks (they need up to {vc.max_length} ids + '|'); "
            f"use at least {vc.max_length + 1}"
        )
    lean = use_cache and lean and LeanSteps.supports(model)
    # When even the prefill is small, the whole call runs on one thread: the set-up's own small ops (RoPE tables,
    # masks, buffers) would otherwise each fork and join too. Each phase below decides again for itself.
    whole = LeanSteps.threads_for(model, rows=prompt.input_ids.numel()) if lean else None
    with _intra_op_threads(whole):
        steps_class = _LeanSteps if lean else _Steps if use_cache else _Recompute
        return _decode(
            model,
            prompt,
            vocab,
            vc,
            images,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            generator=generator,
            steps_class=steps_class,
            num_beams=num_beams,
            trace=trace,
            forced=forced_ids,
        )


@contextlib.contextmanager
def _intra_op_threads(n: int | None):
    """Run the block with ``n`` torch intra-op threads (process-wide, restored after); None leaves them alone."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


NONFINITE_ERROR = "the model's logits were NaN or inf (its weights diverged?); these ids mean nothing"


def _forced(forced: list[list[int]] | None, vocab: VocabMap, rows: int, num_beams: int, device) -> torch.Tensor | None:
    """``forced`` action ids as model ids ``[B * num_beams, longest]``, -1 past each row's own (None: none forced)."""
    if forced is None or not any(len(row) for row in forced):
        return None
    if len(forced) != rows:
        raise ValueError(f"forced ids for {len(forced)} rows, but the prompt has {rows}: give one list per row")
    bad = [a for row in forced for a in row if not 0 <= int(a) < vocab.action_vocab_size]
    if bad:
        raise ValueError(f"forced id {bad[0]} is not an action id: use ids in [0, {vocab.action_vocab_size})")
    longest = max(len(row) for row in forced)
    out = torch.full((rows, longest), -1, dtype=torch.long)
    for r, row in enumerate(forced):
        if len(row):
            out[r, : len(row)] = torch.as_tensor(vocab.action_to_vocab(np.asarray(row, dtype=np.int64)))
    return out.repeat_interleave(num_beams, dim=0).to(device)


def _force(allowed: torch.Tensor, forced: torch.Tensor | None, step: int) -> torch.Tensor:
    """``allowed`` ``[B, V]`` with, on every row that has a forced id at ``step``, only that id possible (its own
    logit kept)."""
    if forced is None or step >= forced.shape[1]:
        return allowed
    ids = forced[:, step]
    rows = ids >= 0
    at = ids.clamp(min=0)[:, None]
    kept = allowed.gather(1, at)  # [B, 1]
    if bool(torch.isneginf(kept[rows]).any()):
        raise ValueError(
            f"a forced id at step {step} is one the constraint does not allow there; force only ids that spell the "
            "start of a valid chunk (ActionTokenizer.prefix_ids)"
        )
    only = torch.full_like(allowed, float("-inf")).scatter(1, at, kept)
    return torch.where(rows[:, None], only, allowed)


def _allowed(logits: torch.Tensor, vc, states, vocab: VocabMap) -> torch.Tensor:
    """``[B, V]`` logits with what may not come next at -inf: the constraint's mask per row, or (unconstrained) only
    the image placeholder."""
    if vc is not None:
        return logits.masked_fill(~vc.masks(states).to(logits.device), float("-inf"))
    return logits.index_fill(-1, torch.tensor([vocab.text.image_id], device=logits.device), float("-inf"))


class _Beams:
    """Beam search's bookkeeping for ``rows`` prompts of ``k`` hypotheses each (model rows ``r * k .. r * k + k - 1``):
    their summed log-probabilities, and which rows each step's survivors came from."""

    def __init__(self, rows: int, k: int, device: torch.device):
        self.k = k
        # The k copies of a prompt are identical at first: only the first may grow, or the step would pick k copies
        # of the same id.
        self.scores = torch.full((rows, k), float("-inf"), device=device)
        self.scores[:, 0] = 0.0

    def select(self, logits: torch.Tensor, done: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``logits`` ``[R * k, V]`` (masked ids at -inf), ``done`` ``[R * k]`` (hypotheses that stopped, which go on
        with ``pad`` at no cost) -> the parent row ``[R * k]`` and the id ``[R * k]`` of each surviving hypothesis."""
        rows, k = self.scores.shape
        logp = torch.log_softmax(logits.float(), dim=-1)  # [R * k, V]
        logp = logp.masked_fill(done[:, None] | logp.isnan(), float("-inf"))  # NaN logits: no continuation
        logp[:, pad] = torch.where(done, 0.0, logp[:, pad])
        total = (self.scores.reshape(-1, 1) + logp).reshape(rows, -1)  # [R, k * V]
        self.scores, flat = total.topk(k, dim=-1)  # [R, k]
        v = logp.shape[-1]
        parent = flat // v + torch.arange(rows, device=flat.device)[:, None] * k
        return parent.flatten(), (flat % v).flatten()

    @property
    def dead(self) -> torch.Tensor:
        """bool ``[R * k]``: hypotheses with no probability left (fewer allowed continuations than beams)."""
        return ~torch.isfinite(self.scores).flatten()

    def best(self) -> torch.Tensor:
        """``[R]``: the model row of each prompt's most probable hypothesis."""
        rows, k = self.scores.shape
        return self.scores.argmax(dim=-1) + torch.arange(rows, device=self.scores.device) * k


def _repeat_rows(prompt: Sequence, k: int) -> Sequence:
    """Each row of ``prompt`` ``k`` times in a row (beam search's hypotheses)."""
    return Sequence(**{name: t.repeat_interleave(k, dim=0) for name, t in prompt.__dict__.items()})


class _Steps:
    """How a decoding back-end gives logits: ``prefill()`` -> ``[B, V]`` for the prompt's last position, ``step(token,
    step)`` -> ``[B, V]`` after feeding ``token`` ``[B]``, ``reorder(rows)`` to follow beam search's survivors, and
    ``threads()`` for the steps' intra-op threads (None: torch's setting). One class per back-end: transformers'
    forward with its KV cache (this class), ``_LeanSteps`` (the lean layers on a static cache) and ``_Recompute``
    (everything recomputed each step, the reference)."""

    use_cache = True

    def __init__(self, model, prompt: Sequence, images: torch.Tensor | None, max_new_tokens: int) -> None:
        self.model, self.prompt, self.images = model, prompt, images
        self.next_position = prompt.position_ids[:, -1] + 1  # [B]: left padding ends every row in the last column
        self.ones = torch.ones(len(prompt), max_new_tokens, dtype=torch.bool, device=prompt.input_ids.device)
        self.cache = None

    def prefill(self) -> torch.Tensor:
        p = self.prompt
        out = self.model(
            p.input_ids,
            p.attention_mask,
            p.position_ids,
            token_type_ids=p.ar,
            images=self.images,
            use_cache=self.use_cache,
            state=p.state,
            state_slots=p.state_slots,
        )
        self.cache = out.past_key_values if self.use_cache else None
        return self.model.logits(out.last_hidden_state[:, -1])

    def step(self, token: torch.Tensor, step: int) -> torch.Tensor:
        """One new token attends to every valid key so far (the cache) and itself."""
        key_valid = torch.cat([self.prompt.valid, self.ones[:, : step + 1]], dim=1)  # [B, Lp + step + 1]
        out = self.model(
            token[:, None],
            key_valid[:, None, :],
            (self.next_position + step)[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        return self.model.logits(out.last_hidden_state[:, -1])

    def reorder(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(rows)

    def threads(self) -> int | None:
        return None


class _LeanSteps(_Steps):
    """The backbone's layers as plain tensor ops on a static KV cache (``vla.model.lean.LeanSteps``): the same
    arithmetic as transformers' forward, without the framework; one thread for small steps."""

    def __init__(self, model, prompt: Sequence, images: torch.Tensor | None, max_new_tokens: int) -> None:
        super().__init__(model, prompt, images, max_new_tokens)
        self.lean = model.lean_steps(prompt, max_new_tokens)

    def prefill(self) -> torch.Tensor:
        with _intra_op_threads(LeanSteps.threads_for(self.model, rows=self.prompt.input_ids.numel())):
            return self.model.logits(self.lean.prefill(self.prompt, self.images))

    def step(self, token: torch.Tensor, step: int) -> torch.Tensor:
        return self.model.logits(self.lean(token, step))

    def reorder(self, rows: torch.Tensor) -> None:
        self.lean.reorder(rows)

    def threads(self) -> int | None:
        return LeanSteps.threads_for(self.model, rows=len(self.prompt))  # see LeanSteps.SINGLE_THREAD_MACS


class _Recompute(_Steps):
    """No cache: the prompt and every token so far recomputed at each step, as one suffix-extended sequence (the
    reference the cached back-ends must match id for id)."""

    use_cache = False  # the prefill keeps no cache

    def __init__(self, model, prompt: Sequence, images: torch.Tensor | None, max_new_tokens: int) -> None:
        super().__init__(model, prompt, images, max_new_tokens)
        self.tokens = torch.zeros(len(prompt), 0, dtype=torch.long, device=prompt.input_ids.device)

    def step(self, token: torch.Tensor, step: int) -> torch.Tensor:
        p = self.prompt
        new = self.tokens = torch.cat([self.tokens, token[:, None]], dim=1)  # [B, step + 1]: every token so far
        valid = torch.cat([p.valid, self.ones[:, : step + 1]], dim=1)
        ar = torch.cat([p.ar, torch.ones_like(new)], dim=1)
        positions = self.next_position[:, None] + torch.arange(step + 1, device=new.device)  # [B, step + 1]
        slots = torch.cat([p.state_slots, torch.zeros_like(new, dtype=torch.bool)], dim=1)
        out = self.model(
            torch.cat([p.input_ids, new], dim=1),
            prefix_lm_mask(valid, ar),
            torch.cat([p.position_ids, positions], dim=1),
            token_type_ids=ar,
            images=self.images,
            state=p.state,
            state_slots=slots,
        )
        return self.model.logits(out.last_hidden_state[:, -1])

    def reorder(self, rows: torch.Tensor) -> None:
        self.tokens = self.tokens[rows]


def _decode(
    model,
    prompt,
    vocab,
    vc,
    images,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    generator,
    steps_class: type[_Steps],
    num_beams: int = 1,
    trace=None,
    forced: torch.Tensor | None = None,
) -> Generation:
    """``generate`` after its checks: the back-end's prefill, then one token per step under the constraint; with
    ``num_beams`` > 1 every row runs as that many hypotheses, the back-end following the survivors of each step."""
    device = model.device
    prompt = prompt.to(device)
    beams = None
    if num_beams > 1:
        beams = _Beams(len(prompt), num_beams, device)
        prompt = _repeat_rows(prompt, num_beams)
        images = images.repeat_interleave(num_beams, dim=0) if images is not None else None
    b = len(prompt)
    pad, end_id, eos_id = vocab.text.pad_id, vocab.end_id, vocab.text.eos_id
    states = [vc.start() for _ in range(b)] if vc is not None else None
    finished = torch.zeros(b, dtype=torch.bool, device=device)  # the row emitted "|" or EOS
    done = finished.clone()  # finished, or a hypothesis beam search has no probability left for
    tokens = torch.full((b, max_new_tokens), pad, dtype=torch.long, device=device)
    nonfinite = torch.zeros(b, dtype=torch.bool, device=device)  # rows whose logits held NaN/inf: never valid
    log_prob = torch.zeros(b, device=device)
    back_end = steps_class(model, prompt, images, max_new_tokens)
    logits = back_end.prefill()  # [B, V]
    steps = 0
    with _intra_op_threads(back_end.threads()):
        for step in range(max_new_tokens):
            nonfinite |= ~torch.isfinite(logits).all(dim=-1) & ~done  # on the device: no sync per step
            allowed = _force(_allowed(logits, vc, states, vocab), forced, step)
            if beams is None:
                token = sample(allowed, temperature, top_p, generator)  # [B]
            else:  # the k best continuations of each prompt's hypotheses; every row takes its parent's history
                rows, token = beams.select(allowed, done, pad)
                allowed, log_prob = allowed[rows], log_prob[rows]
                tokens, finished, nonfinite = tokens[rows], finished[rows], nonfinite[rows]
                states = [states[i] for i in rows.tolist()] if states is not None else None
                back_end.reorder(rows)
                done = finished | beams.dead
            token = token.masked_fill(done, pad)
            if trace is not None:
                trace(step, allowed, token)
            picked = torch.log_softmax(allowed.float(), dim=-1).gather(1, token[:, None]).squeeze(1)
            log_prob += torch.where(done, 0.0, picked)
            tokens[:, step] = token
            steps = step + 1
            if vc is not None:
                active = range(b) if step == 0 and beams is None else torch.nonzero(~done).flatten().tolist()
                vc.advance_batch(states, token, active)
            finished |= (token == end_id) | (token == eos_id)
            done |= finished
            if step + 1 == max_new_tokens or bool(done.all()):
                break
            logits = back_end.step(token, step)
    if beams is not None:  # each prompt's most probable hypothesis
        best = beams.best()
        tokens, finished, nonfinite, log_prob = tokens[best], finished[best], nonfinite[best], log_prob[best]
    gen = _collect(tokens[:, :steps].cpu(), finished.cpu().numpy(), vocab, steps, nonfinite.cpu().numpy())
    gen.log_prob = log_prob.cpu().numpy()
    return gen


def _decode_parallel(
    model, prompt, vocab, vc, images, temperature, top_p, generator, lean, trace=None, forced=None
) -> Generation:
    """One forward pass over prompt + query slots, then the slots' ids picked in order under the constraint."""
    device = model.device
    prompt = prompt.to(device)
    slots = prompt.query_slots
    n = int(slots[0].sum())
    if not bool((slots.sum(dim=1) == n).all()) or not bool(slots[:, -n:].all()):
        raise ValueError(
            "every row of a parallel prompt needs the same number of query slots in its last columns; "
            "build it with SequenceLayout(decoding='parallel').build_prefix"
        )
    if vc is not None and fixed_chunk_length(vc.constraint) not in (None, n):
        raise ValueError(
            f"the prompt has {n} query slots but the constraint's chunks have "
            f"{fixed_chunk_length(vc.constraint)} ids; build both from the same tokenizer"
        )
    b = len(prompt)
    if lean and LeanSteps.supports(model):
        with _intra_op_threads(LeanSteps.threads_for(model, rows=prompt.input_ids.numel())):
            hidden = model.lean_steps(prompt, 0).prefill(prompt, images, last=n)  # [B, n, H]
    else:
        out = model(
            prompt.input_ids,
            prompt.attention_mask,
            prompt.position_ids,
            token_type_ids=prompt.ar,
            images=images,
            state=prompt.state,
            state_slots=prompt.state_slots,
            query_slots=slots,
        )
        hidden = out.last_hidden_state[:, -n:]
    logits = model.logits(hidden)  # [B, n, V]
    nonfinite = ~torch.isfinite(logits).flatten(1).all(dim=1)
    states = [vc.start() for _ in range(b)] if vc is not None else None
    tokens = torch.empty(b, n, dtype=torch.long, device=device)
    for i in range(n):  # no model call here: each slot's mask follows the ids picked before it
        allowed = _force(_allowed(logits[:, i], vc, states, vocab), forced, i)
        tokens[:, i] = sample(allowed, temperature, top_p, generator)
        if trace is not None:
            trace(i, allowed, tokens[:, i])
        if vc is not None:
            vc.advance_batch(states, tokens[:, i], range(b))
    tokens = tokens.cpu()
    ids, valid, errors = [], np.zeros(b, dtype=bool), []
    nonfinite = nonfinite.cpu().numpy()
    for r, row in enumerate(vocab.vocab_to_action(tokens).tolist()):
        error = None
        if nonfinite[r]:
            error = NONFINITE_ERROR
        elif any(a < 0 for a in row):
            k = next(k for k, a in enumerate(row) if a < 0)
            error = f"slot {k} holds the non-action id {int(tokens[r, k])}"
        elif vc is not None and not vc.done(states[r]):
            error = f"the constraint is not done after the {n} slots"
        ids.append([a for a in row if a >= 0])
        valid[r] = error is None
        errors.append(error)
    return Generation(ids=ids, tokens=tokens, finished=np.ones(b, dtype=bool), valid=valid, errors=errors, steps=1)


def _collect(
    tokens: torch.Tensor, finished: np.ndarray, vocab: VocabMap, steps: int, nonfinite: np.ndarray | None = None
) -> Generation:
    """Split each row at its stop token, map action ids back, and say why a row is invalid. A row whose logits were
    not finite is invalid whatever ids the constraint made of them (a diverged model must not look healthy)."""
    ids, valid, errors = [], np.zeros(len(tokens), dtype=bool), []
    stop_ids = {vocab.end_id, vocab.text.eos_id}
    for i, row in enumerate(tokens.tolist()):
        end = next((k for k, t in enumerate(row) if t in stop_ids), len(row))
        body = np.asarray(row[:end], dtype=np.int64)
        actions = vocab.vocab_to_action(body)
        error = None
        if nonfinite is not None and nonfinite[i]:
            error = NONFINITE_ERROR
        elif not finished[i]:
            error = f"no '|' or EOS within {steps} generated tokens"
        elif (actions < 0).any():
            k = int(np.flatnonzero(actions < 0)[0])
            error = f"generated token {k} is the non-action id {int(body[k])}"
        ids.append(actions[actions >= 0].tolist())
        valid[i] = error is None
        errors.append(error)
    return Generation(ids=ids, tokens=tokens, finished=finished, valid=valid, errors=errors, steps=steps)
