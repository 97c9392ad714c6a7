"""Decoding latency on CPU: the lean KV-cache loop vs transformers' cached forward vs full recomputation, constraint
on vs off, for every tokenizer; and a saved policy's ``predict_action_chunk``.

    python scripts/bench_decode.py --out results/bench_decode.json [--presets tiny small] [--threads 2]
        [--policy outputs/train/fast/policy]

Decoders (``decoder`` in each row): ``lean`` is ``generate``'s default with the cache (``vla.model.decode.LeanSteps``: the
backbone's layers as plain tensor ops on a static KV cache), ``transformers`` the same cache through transformers'
forward (``lean=False``), ``recompute`` no cache at all (``use_cache=False``). All three generate identical ids here.
``parallel`` (fixed-length tokenizers only; not in the default set) is one-pass decoding: the same backbone with one
learned query slot per id (``SequenceLayout(decoding="parallel")``), every slot predicted in one lean forward pass;
its ids differ (its own slots), its latency is what ``policy.decoding=parallel`` costs (``results/parallel/``).

One observation per chunk (batch 1, as on a robot): one 64/96 px camera, a 39-D state (Meta-World's), a short
task. Weights are random (seed 0) and decoding is greedy (the policy's default), so the KV-cache and recomputation
rows generate identical ids, and each unconstrained row decodes exactly as many steps as its constrained twin:
latency differences are the cache's and the constraint's own. A row's latency covers what
``VLAPolicy.predict_action_chunk`` does: build the prompt, prefill, decode, detokenise.

``valid_rate`` is measured separately on a batch of chunks sampled at temperature 1 with the policy's default budget
(the constraint's ``max_length + 1`` ids): random weights are the worst case for validity.

``constraint_ms_per_step`` replays the generated ids through the constraint alone (mask gather, ``masked_fill``,
advance), a noise-free measure of its cost next to the end-to-end difference ``constraint_overhead``.

Output: ``{"meta": ..., "rows": [one per (preset, tokenizer, kv_cache, constrained)], "summary": [...]}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

import action_tokenizers as at
import numpy as np
import torch
from action_tokenizers.synthetic import smooth_chunks

from vla.model.decode import VocabConstraint, fixed_chunk_length, generate
from vla.model.prefix_lm import build_model
from vla.model.sequence import SequenceLayout
from vla.model.vocab import VocabMap
from vla.provenance import processor_name, provenance

TASK = "push the puck to the goal"


def fit_tokenizers(time_horizon: int, action_dim: int) -> dict[str, at.ActionTokenizer]:
    chunks = smooth_chunks(2000, time_horizon, action_dim, seed=0)
    return {
        "fast": at.FASTTokenizer.fit(chunks, vocab_size=512),
        "bin": at.BinningTokenizer.fit(chunks, n_bins=256),
        "fsq": at.FSQTokenizer.fit(chunks, hidden=32, depth=1, steps=300, show_progress=False),
        "beast": at.BEASTTokenizer.fit(chunks, n_control_points=6),
    }


DECODERS = {
    "lean": dict(use_cache=True, lean=True),
    "transformers": dict(use_cache=True, lean=False),
    "recompute": dict(use_cache=False),
    "parallel": dict(use_cache=True, lean=True),
}
DEFAULT_DECODERS = ["lean", "transformers", "recompute"]


def predict(
    model,
    layout,
    tok,
    constraint,
    images,
    state,
    *,
    decoder: str = "lean",
    max_new_tokens: int,
    t: int,
    d: int,
    temperature: float = 0.0,
    generator=None,
):
    """What predict_action_chunk does, minus normalisation: prompt -> ids -> chunk. Returns (generation, decoded)."""
    prompt = layout.build_prefix([TASK] * len(state), state)
    gen = generate(
        model,
        prompt,
        vocab=layout.vocab,
        constraint=constraint,
        images=images,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        generator=generator,
        **DECODERS[decoder],
    )
    return gen, gen.decode(tok, t, d)


def generated_ids(gen, vocab: VocabMap) -> int:
    """Ids generated for row 0 before its stop token (all of them when it never stopped)."""
    row = gen.tokens[0].tolist()
    stops = [k for k, t in enumerate(row) if t in (vocab.end_id, vocab.text.eos_id)]
    return stops[0] if stops else len(row)


def constraint_ms_per_step(constraint: VocabConstraint, tokens: torch.Tensor, reps: int = 200) -> float:
    """The constraint's own work per step (mask gather, masked_fill, advance), replayed on a generated row."""
    logits = torch.zeros(1, constraint.vocab.model_vocab_size)
    row = tokens[0].tolist()
    start = time.perf_counter()
    for _ in range(reps):
        states = [constraint.start()]
        for token in row:
            logits.masked_fill(~constraint.masks(states), float("-inf"))
            constraint.advance_batch(states, torch.tensor([token]), [0])
    return (time.perf_counter() - start) * 1000 / (reps * len(row))


def bench_preset(preset: str, toks: dict, args) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    for name, tok in toks.items():
        vocab = VocabMap.compact(tok.vocab_size)
        model = build_model(preset, vocab, num_cameras=1, seed=0).eval()
        layout = SequenceLayout(vocab, image_tokens=model.image_tokens, num_cameras=1, max_prefix_len=256)
        constraint = VocabConstraint(tok.constraint(args.time_horizon, args.action_dim), vocab)
        slots = fixed_chunk_length(constraint.constraint)
        decoders = [d for d in args.decoders if d != "parallel" or slots is not None]
        parallel = (None, None)  # (model, layout) of one-pass decoding: the same backbone weights plus the query slots
        if "parallel" in decoders:
            parallel = (
                build_model(preset, vocab, num_cameras=1, seed=0, query_slots=slots).eval(),
                SequenceLayout(
                    vocab,
                    image_tokens=model.image_tokens,
                    num_cameras=1,
                    max_prefix_len=256,
                    decoding="parallel",
                    num_slots=slots,
                ),
            )
        state = rng.uniform(-1, 1, (1, args.state_dim))
        images = torch.rand(1, 1, 3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(0))
        shape = dict(t=args.time_horizon, d=args.action_dim)
        # The constrained greedy run fixes the number of steps both constrained and free rows decode.
        gen, _ = predict(
            model, layout, tok, constraint, images, state, max_new_tokens=constraint.max_length + 1, **shape
        )
        steps = gen.steps
        constraint_ms = constraint_ms_per_step(constraint, gen.tokens)
        prefix_len = int(layout.build_prefix([TASK], state).valid.sum())
        validity = {}  # (one-pass?, constrained) -> (valid rate, ids per chunk, chunks)
        for one_pass, (m, lay) in ((False, (model, layout)), (True, parallel)):
            if m is None:
                continue
            for constrained in (True, False):
                n = args.valid_chunks[preset]
                sampled, out = predict(
                    m,
                    lay,
                    tok,
                    constraint if constrained else None,
                    images.expand(n, -1, -1, -1, -1),
                    rng.uniform(-1, 1, (n, args.state_dim)),
                    max_new_tokens=constraint.max_length + 1,
                    temperature=1.0,
                    generator=torch.Generator().manual_seed(0),
                    **shape,
                )
                validity[one_pass, constrained] = (float(out.valid.mean()), float(np.mean(sampled.tokens_per_chunk)), n)
        reps = {d: args.reps[preset] if d != "recompute" else max(2, args.reps[preset] // 2) for d in decoders}
        runs = {(d, c): ([], [], []) for d in decoders for c in (True, False)}  # -> (times, tokens, valid)
        for rep in range(max(reps.values()) + 1):  # the first run warms caches (allocator, masks) and is dropped
            for decoder in decoders:  # interleaved, so load on a shared machine hits every row alike
                if rep > reps[decoder]:
                    continue
                m, lay = parallel if decoder == "parallel" else (model, layout)
                for constrained in (True, False):
                    start = time.perf_counter()
                    budget = constraint.max_length + 1 if constrained else steps
                    g, out = predict(
                        m,
                        lay,
                        tok,
                        constraint if constrained else None,
                        images,
                        state,
                        decoder=decoder,
                        max_new_tokens=budget,
                        **shape,
                    )
                    elapsed = (time.perf_counter() - start) * 1000
                    if rep:
                        times, tokens, valid = runs[decoder, constrained]
                        times.append(elapsed)
                        tokens.append(generated_ids(g, layout.vocab))
                        valid.append(bool(out.valid[0]))
        for decoder in decoders:
            for constrained in (True, False):
                times, tokens, valid = runs[decoder, constrained]
                n_steps = 1 if decoder == "parallel" else steps
                rate, sampled_tokens, n = validity[decoder == "parallel", constrained]
                row = {
                    "preset": preset,
                    "tokenizer": name,
                    "decoder": decoder,
                    "kv_cache": decoder != "recompute",
                    "constrained": constrained,
                    "latency_ms_p50": round(float(np.percentile(times, 50)), 2),
                    "latency_ms_p95": round(float(np.percentile(times, 95)), 2),
                    "latency_ms_min": round(float(np.min(times)), 2),
                    "tokens_per_chunk": float(np.mean(tokens)),
                    "valid_rate": rate,
                    "decode_steps": n_steps,
                    "ms_per_step_p50": round(float(np.percentile(times, 50)) / n_steps, 3),
                    "prefix_tokens": prefix_len,
                    "reps": reps[decoder],
                    "greedy_chunk_valid": float(np.mean(valid)),
                    "valid_rate_chunks": n,
                    "sampled_tokens_per_chunk": sampled_tokens,
                    "params_m": round(model.num_parameters() / 1e6, 2),
                    "constraint_ms_per_step": round(constraint_ms, 4),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        rows.extend(step_split(model, layout, constraint, images, state, preset, name, args))
    return rows


def step_split(model, layout, constraint, images, state, preset: str, name: str, args) -> list[dict]:
    """Where a lean chunk's time goes: the prefill (prompt + images through the layers) against one step."""
    from vla.model.decode import LeanSteps, _intra_op_threads

    if "lean" not in args.decoders or not LeanSteps.supports(model):
        return []
    prompt = layout.build_prefix([TASK], state)
    n = constraint.max_length + 1
    prefill, step = [], []
    token = torch.tensor([layout.vocab.end_id])
    prefill_threads = LeanSteps.threads_for(model, rows=prompt.input_ids.numel())  # as generate runs each phase
    step_threads = LeanSteps.threads_for(model, rows=1)
    with torch.inference_mode():
        for rep in range(args.reps[preset] + 1):
            start = time.perf_counter()
            with _intra_op_threads(prefill_threads):
                lean = LeanSteps(model, prompt, n)
                lean.prefill(prompt, images)
            mid = time.perf_counter()
            with _intra_op_threads(step_threads):
                for k in range(min(8, n - 1)):
                    model.logits(lean(token, k))
            end = time.perf_counter()
            if rep:
                prefill.append((mid - start) * 1000)
                step.append((end - mid) * 1000 / min(8, n - 1))
    row = {
        "preset": preset,
        "tokenizer": name,
        "split": True,
        "prefill_ms_p50": round(float(np.median(prefill)), 2),
        "lean_step_ms_p50": round(float(np.median(step)), 3),
        "reps": args.reps[preset],
    }
    print(json.dumps(row), flush=True)
    return [row]


def bench_policy(path: Path, reps: int) -> list[dict]:
    """A saved policy's ``predict_action_chunk`` (batch 1), lean loop against transformers' cached forward."""
    import vla.model.decode as decode
    from vla.policy import VLAPolicy

    policy = VLAPolicy.from_pretrained(path).eval()
    c = policy.config
    rng = np.random.default_rng(0)
    low = policy.state_normalizer.unnormalize(-np.ones(c.state_dim))  # states across the data's q01..q99
    high = policy.state_normalizer.unnormalize(np.ones(c.state_dim))
    original = decode.generate
    module = sys.modules[type(policy).__module__]  # where predict_action_chunk looks generate up
    times = {"lean": [], "transformers": []}
    steps = []
    for rep in range(reps + 1):  # the first run warms up and is dropped
        state = torch.as_tensor(rng.uniform(low, high, (1, c.state_dim)), dtype=torch.float32)
        batch = {"observation.state": state, "task": [TASK]}
        for key in c.image_keys:
            batch[key] = torch.rand(1, 3, c.image_size or 64, c.image_size or 64)
        for decoder in times:  # interleaved: the same observation, the same load
            module.generate = original if decoder == "lean" else functools.partial(original, lean=False)
            try:
                start = time.perf_counter()
                policy.predict_action_chunk(batch)
                elapsed = (time.perf_counter() - start) * 1000
            finally:
                module.generate = original
            if rep:
                times[decoder].append(elapsed)
                if decoder == "lean":
                    steps.append(policy.last_decode_info["steps"])
    rows = []
    for decoder, t in times.items():
        row = {
            "policy": str(path),
            "decoder": decoder,
            "latency_ms_p50": round(float(np.median(t)), 2),
            "latency_ms_p95": round(float(np.percentile(t, 95)), 2),
            "latency_ms_min": round(float(np.min(t)), 2),
            "decode_steps_mean": float(np.mean(steps)),
            "reps": reps,
            "ms_per_step_p50": round(float(np.median(t)) / float(np.mean(steps)), 3),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# Robots of every width, as their policies are trained (state only, the state as one embedding, tiny, FAST): name ->
# (time_horizon, action_dim, state_dim, FAST scale, ids per chunk of the trained policy). The FAST scale is the one
# whose encoding of the synthetic chunks has about the trained policy's ids per chunk; the weights are random, and
# model seeds and seeded states are tried in turn until the untrained model's greedy chunk is within 25% of that
# count (a briefly trained tiny model learns the commonest id first and runs to the budget, 260 ids: no better).
WIDE = {"push": (10, 4, 39, 10.0, 9), "wide26": (10, 26, 26, 6.0, 36), "aloha": (50, 14, 14, 5.0, 27)}


def bench_wide(names: list[str], threads: list[int], reps: int) -> list[dict]:
    """p50 of a whole chunk (prompt, lean prefill and steps under the constraint, detokenising) per robot width and
    number of torch threads, with where a chunk's time goes (prefill, model step, constraint per step)."""
    from vla.model.decode import LeanSteps, _intra_op_threads

    rows = []
    for name in names:
        t, d, s, scale, target = WIDE[name]
        chunks = smooth_chunks(1000, t, d, seed=0)
        tok = at.FASTTokenizer.fit(chunks, scale=scale, vocab_size=1024)
        data_ids = float(np.mean([len(r) for r in tok.encode(chunks[:200])]))
        vocab = VocabMap.compact(tok.vocab_size, words=list(dict.fromkeys(TASK.split())))
        layout = SequenceLayout(vocab, num_cameras=0, state_encoding="embedding")
        constraint = VocabConstraint(tok.constraint(time_horizon=t, action_dim=d), vocab)
        budget = constraint.max_length + 1
        rng = np.random.default_rng(0)
        found = False
        for seed in range(20):  # weights and a state whose untrained greedy chunk has a trained policy's length
            model = build_model("tiny", vocab, num_cameras=0, seed=seed, state_dim=s, state_tokens=1).eval()
            for _ in range(5):
                state = rng.uniform(-1, 1, (1, s))
                gen, _ = predict(model, layout, tok, constraint, None, state, max_new_tokens=budget, t=t, d=d)
                found = abs(len(gen.ids[0]) - target) <= 0.25 * target
                if found:
                    break
            if found:
                break
        ids = len(gen.ids[0])
        constraint_ms = constraint_ms_per_step(constraint, gen.tokens)
        for n in threads:
            before = torch.get_num_threads()
            torch.set_num_threads(n)
            try:
                times, prefill, step = [], [], []
                prompt = layout.build_prefix([TASK], state)
                token = torch.tensor([vocab.end_id])
                for rep in range(reps + 1):  # the first run warms up and is dropped
                    start = time.perf_counter()
                    g, out = predict(model, layout, tok, constraint, None, state, max_new_tokens=budget, t=t, d=d)
                    elapsed = (time.perf_counter() - start) * 1000
                    with torch.inference_mode():
                        a = time.perf_counter()
                        with _intra_op_threads(LeanSteps.threads_for(model, rows=prompt.input_ids.numel())):
                            lean = LeanSteps(model, prompt, budget)
                            lean.prefill(prompt, None)
                        b = time.perf_counter()
                        with _intra_op_threads(LeanSteps.threads_for(model, rows=1)):
                            for k in range(8):
                                model.logits(lean(token, k))
                        c = time.perf_counter()
                    if rep:
                        assert g.ids == gen.ids and bool(out.valid[0])  # greedy: the same chunk every time
                        times.append(elapsed)
                        prefill.append((b - a) * 1000)
                        step.append((c - b) * 1000 / 8)
            finally:
                torch.set_num_threads(before)
            p50 = float(np.percentile(times, 50))
            row = {
                "robot": name,
                "model_seed": seed,
                "time_horizon": t,
                "action_dim": d,
                "state_dim": s,
                "fast_scale": scale,
                "threads": n,
                "decoder": "lean",
                "ids_per_chunk": ids,
                "trained_ids_per_chunk": target,
                "tokenizer_ids_per_chunk": round(data_ids, 1),
                "decode_steps": g.steps,
                "latency_ms_p50": round(p50, 2),
                "latency_ms_p95": round(float(np.percentile(times, 95)), 2),
                "ms_per_step_p50": round(p50 / g.steps, 3),
                "prefill_ms_p50": round(float(np.median(prefill)), 2),
                "lean_step_ms_p50": round(float(np.median(step)), 3),
                "constraint_ms_per_step": round(constraint_ms, 4),
                "reps": reps,
                "load_average": round(os.getloadavg()[0], 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per (preset, tokenizer): KV-cache speed-up over recomputation and the constraint's latency cost."""
    out = []
    key = lambda r: (r["preset"], r["tokenizer"])  # noqa: E731
    rows = [r for r in rows if "decoder" in r]
    for preset, name in dict.fromkeys(map(key, rows)):
        get = {(r["decoder"], r["constrained"]): r for r in rows if key(r) == (preset, name)}
        lean = get.get(("lean", True))
        entry = {"preset": preset, "tokenizer": name, "action_tokens": next(iter(get.values()))["tokens_per_chunk"]}
        if lean and ("recompute", True) in get:
            entry["kv_speedup"] = round(get["recompute", True]["latency_ms_p50"] / lean["latency_ms_p50"], 2)
        if lean and ("transformers", True) in get:
            entry["lean_speedup"] = round(get["transformers", True]["latency_ms_p50"] / lean["latency_ms_p50"], 2)
        if lean and ("parallel", True) in get:
            entry["parallel_speedup"] = round(lean["latency_ms_p50"] / get["parallel", True]["latency_ms_p50"], 2)
        if lean and ("lean", False) in get:
            entry["constraint_overhead"] = round(lean["latency_ms_p50"] / get["lean", False]["latency_ms_p50"] - 1, 3)
            # the same, measured directly: the constraint's work per step over a cached decoding step
            entry["constraint_share_of_step"] = round(lean["constraint_ms_per_step"] / lean["ms_per_step_p50"], 4)
        any_row = next(iter(get.values()))
        entry["valid_rate_constrained"] = get.get(("lean", True), any_row)["valid_rate"]
        entry["valid_rate_free"] = get.get(("lean", False), any_row)["valid_rate"]
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--tokenizers", nargs="+", default=["fast", "bin", "fsq"])
    parser.add_argument("--time-horizon", type=int, default=8)
    parser.add_argument("--action-dim", type=int, default=4)
    parser.add_argument("--state-dim", type=int, default=39)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--reps", type=int, default=None, help="timed runs per KV-cache row (recompute: half)")
    parser.add_argument("--decoders", nargs="+", default=DEFAULT_DECODERS, choices=list(DECODERS))
    parser.add_argument("--policy", type=Path, default=None, help="also time this saved policy's predict_action_chunk")
    parser.add_argument("--policy-reps", type=int, default=40)
    parser.add_argument(
        "--wide",
        nargs="*",
        default=None,
        choices=list(WIDE),
        help="only the robots of every width (state-only tiny FAST policies): "
        f"{', '.join(WIDE)} (none named: all), at --wide-threads",
    )
    parser.add_argument("--wide-threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument(
        "--allow-loaded",
        action="store_true",
        help="write to --out even when the machine was loaded (default: beside it, as <stem>.loaded.json)",
    )
    args = parser.parse_args(argv)
    args.loads = [os.getloadavg()[0]]  # the 1-minute load at the start; the end's is added before writing
    if args.wide is not None:
        return write_wide(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.reps = {p: args.reps or {"tiny": 20, "small": 6}.get(p, 3) for p in args.presets}
    args.valid_chunks = {p: {"tiny": 200, "small": 24}.get(p, 8) for p in args.presets}
    toks = {k: v for k, v in fit_tokenizers(args.time_horizon, args.action_dim).items() if k in args.tokenizers}
    rows = [row for preset in args.presets for row in bench_preset(preset, toks, args)]
    policy_rows = bench_policy(args.policy, args.policy_reps) if args.policy else []
    result = {
        "meta": {
            "device": "cpu",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "processor": processor_name(),
            "time_horizon": args.time_horizon,
            "action_dim": args.action_dim,
            "state_dim": args.state_dim,
            "cameras": 1,
            "batch": 1,
            "decoding": "greedy, random weights (seed 0); free rows decode as many steps as constrained ones",
            "load_average": os.getloadavg(),
            "cpus": os.cpu_count(),
            "machine_load": _machine(args),
        },
        "rows": [r for r in rows if "decoder" in r],
        "split": [r for r in rows if r.get("split")],
        "policy": policy_rows,
        "summary": summarise(rows),
        "provenance": provenance(config={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}),
    }
    from vla.io import write_json
    from vla.provenance import headline_path

    write_json(headline_path(args.out, result["meta"]["machine_load"], args.allow_loaded), result)
    for s in result["summary"]:
        print(s)


def _machine(args) -> dict:
    """Whether the machine stayed quiet for this run's threads (``vla.provenance.quiet_machine``)."""
    from vla.provenance import quiet_machine

    args.loads.append(os.getloadavg()[0])
    return quiet_machine(args.loads, max(args.wide_threads if args.wide is not None else [torch.get_num_threads()]))


def write_wide(args) -> None:
    from vla.io import atomic_write_text, write_json

    reps = args.reps or 20
    rows = bench_wide(args.wide or list(WIDE), args.wide_threads, reps)
    # The file's other sections (the full comparison of tokenizers and decoders) are kept as they were measured.
    record = json.loads(args.out.read_text()) if args.out.is_file() else {}
    record["wide_meta"] = {
        "device": "cpu",
        "preset": "tiny",
        "batch": 1,
        "cameras": 0,
        "state_encoding": "embedding",
        "decoding": "greedy under the constraint, lean loop, random weights (model_seed per row)",
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "machine_load": _machine(args),
    }
    record["wide"] = rows
    kept = sorted(set(record) - {"wide", "wide_meta", "provenance"})
    record["provenance"] = provenance(
        config={"wide": WIDE, "threads": args.wide_threads, "reps": reps},
        sections_from_an_earlier_run=kept,
        earlier_run=record.get("provenance"),
    )
    from vla.provenance import headline_path

    out = headline_path(args.out, record["wide_meta"]["machine_load"], args.allow_loaded)
    write_json(out, record)
    lines = [
        "# Decoding latency per robot width (`scripts/bench_decode.py --wide`)",
        "",
        f"tiny, batch 1, state only (one embedding), FAST, greedy under the constraint, the lean loop, {reps} "
        f"repetitions after one warm-up, {os.cpu_count()} shared cores. ids: the chunk decoded (random weights, "
        "a state chosen so that it has about a trained policy's count), the trained policy's, and the "
        "tokenizer's own mean on the synthetic chunks.",
        "",
        "| robot | T x D | threads | ids (trained, tokenizer) | p50 ms | p95 ms | per step ms | prefill ms | "
        "model step ms | constraint ms/step | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['robot']} | {r['time_horizon']} x {r['action_dim']} | {r['threads']} | {r['ids_per_chunk']} "
            f"({r['trained_ids_per_chunk']}, {r['tokenizer_ids_per_chunk']}) | {r['latency_ms_p50']} | "
            f"{r['latency_ms_p95']} | {r['ms_per_step_p50']} | {r['prefill_ms_p50']} | {r['lean_step_ms_p50']} | "
            f"{r['constraint_ms_per_step']} | {r['load_average']} |"
        )
    atomic_write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
