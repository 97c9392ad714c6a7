"""``vla inspect``: what the policy sees and does for one sample, drawn.

    vla inspect --policy outputs/train/fast/policy [--dataset DIR --index I] [--out DIR]

Writes to ``--out`` (default: ``inspect/`` beside the policy):
    layout.png          the training sequence of the sample, one cell per token, coloured by kind (image, text,
                        state, action, the suffix's fixed text, padding)
    attention_mask.png  who may attend whom, for the sample and a shorter one packed with it (padding shown):
                        the bidirectional prefix block, the causal suffix triangle, nothing to or from padding
    decoding.png        greedy decoding step by step: the top next-token probabilities under the constraint and
                        how many ids the constraint allowed
    summary.txt         the same in words: lengths, the decoded prompt text, ids, and every intermediate of the
                        pipeline (``Pipeline.step_through``)

Without ``--dataset`` the sample is made up: the middle of the state's and the actions' ranges, the first task word.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot.utils.constants import ACTION, OBS_STATE

from vla.io import save_figure
from vla.policy import VLAPolicy
from vla.policy.pipeline import ACTION_IDS, SEQUENCE, WITHOUT_STATS, run

KINDS = ["padding", "image", "text", "state", "suffix text", "action"]


def sample_of(policy: VLAPolicy, dataset: Path | None, index: int) -> dict[str, Any]:
    """One unbatched training sample: from the dataset, or the middle of the data's range."""
    config = policy.config
    if policy.action_normalizer is None:  # raw samples need normalisers to become what the model reads
        raise ValueError(WITHOUT_STATS)
    if dataset is not None:
        from vla.data.torch_dataset import ActionChunkDataset

        ds = ActionChunkDataset(
            dataset,
            config.time_horizon,
            image_keys=list(config.image_keys),
            backend="lerobot" if config.image_keys else "memory",
            obs_steps=config.n_obs_steps,
        )
        if not 0 <= index < len(ds):
            raise ValueError(f"--index {index} is outside the dataset's {len(ds)} samples")
        return ds[index]
    size = policy.model.image_size
    sample = {
        OBS_STATE: torch.as_tensor(policy.state_normalizer.offset, dtype=torch.float32),
        "task": (config.text_words[4].strip() if len(config.text_words) > 4 else "push"),
        ACTION: torch.as_tensor(
            np.tile(policy.action_normalizer.offset, (config.time_horizon, 1)), dtype=torch.float32
        ),
    }
    for key in config.image_keys:
        sample[key] = torch.full((3, size, size), 0.5)
    return sample


def token_kinds(policy: VLAPolicy, seq) -> np.ndarray:
    """int [B, L]: index into ``KINDS`` for every position of a packed sequence."""
    vocab = policy.vocab
    ids = seq.input_ids
    kinds = torch.full_like(ids, KINDS.index("text"))
    kinds[ids == vocab.text.image_id] = KINDS.index("image")
    kinds[seq.state_slots] = KINDS.index("state")
    kinds[(seq.ar == 1) & seq.valid] = KINDS.index("suffix text")
    kinds[vocab.is_action(ids) & (seq.ar == 1)] = KINDS.index("action")
    kinds[~seq.valid] = KINDS.index("padding")
    return kinds.numpy()


@torch.no_grad()
def trace_decoding(policy: VLAPolicy, batch: dict[str, Any], top: int = 5) -> list[dict[str, Any]]:
    """Greedy decoding of one observation through the policy's own decoding loop (``generate``'s ``trace``): per
    step the top probabilities after the constraint's mask, the chosen id and the size of the allowed set. A
    ``parallel`` policy's steps are its query slots, in the order the constraint picks them."""
    from vla.model.decode import generate

    prompt = run(policy.pipeline.prompt, batch)
    steps: list[dict[str, Any]] = []

    def record(step: int, logits: torch.Tensor, token: torch.Tensor) -> None:
        row = logits[0].float()
        allowed = int(torch.isfinite(row).sum())
        probs = torch.softmax(row, dim=-1)
        best = probs.topk(min(top, allowed)).indices.tolist()
        chosen = int(token[0])
        steps.append(
            {
                "allowed": allowed,
                "top": [(i, float(probs[i])) for i in best],
                "chosen": chosen,
                "action_id": int(policy.vocab.vocab_to_action(np.int64(chosen))),
            }
        )

    generate(
        policy.model,
        prompt[SEQUENCE],
        vocab=policy.vocab,
        constraint=policy.constraint,
        images=prompt.get("images"),
        max_new_tokens=policy.max_new_tokens,
        temperature=0.0,
        trace=record,
    )
    return steps


def inspect_policy(
    policy: VLAPolicy | str | Path, out_dir: str | Path, dataset: str | Path | None = None, index: int = 0
) -> dict[str, Any]:
    """Write the pictures and the summary for one sample; returns the summary's numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    if not isinstance(policy, VLAPolicy):
        policy = VLAPolicy.from_pretrained(policy)
    policy.eval()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sample = sample_of(policy, Path(dataset) if dataset is not None else None, index)
    # The sample packed with a copy whose chunk is cut shorter (FAST) or the same (fixed-length): padding shows.
    batch = torch.utils.data.default_collate([sample, sample])
    steps = list(policy.pipeline.step_through(batch, "training"))
    trained = steps[-1][1]
    seq = trained[SEQUENCE]
    # make the second row shorter so the picture has padding (a parallel layout's slots are fixed: left as they are)
    if len(trained[ACTION_IDS][1]) > 1 and policy.config.decoding != "parallel":
        trained[ACTION_IDS][1] = trained[ACTION_IDS][1][: max(1, len(trained[ACTION_IDS][1]) // 2)]
        seq = policy.layout.build_training_sequence(trained["task"], trained[OBS_STATE], trained[ACTION_IDS])
    kinds = token_kinds(policy, seq)
    palette = ["#eeeeee", "#8e44ad", "#3498db", "#27ae60", "#f39c12", "#e74c3c"]
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(max(7, kinds.shape[1] * 0.12), 2.2))
    ax.imshow(kinds, cmap=ListedColormap(palette), vmin=0, vmax=len(KINDS) - 1, aspect="auto")
    ax.set(yticks=[0, 1], yticklabels=["row 0", "row 1"], xlabel="position", title="token layout of the packed batch")
    fig.legend(
        handles=[Patch(color=c, label=k) for k, c in zip(KINDS, palette)],
        loc="lower center",
        ncol=6,
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.15, 1, 1))
    save_figure(fig, out_dir / "layout.png")

    mask = seq.attention_mask.numpy()
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    for row, ax in enumerate(axes):
        ax.imshow(mask[row], cmap="Greys", interpolation="nearest")
        ax.set(title=f"row {row}: black = query (down) may attend key (across)", xlabel="key", ylabel="query")
    fig.tight_layout()
    save_figure(fig, out_dir / "attention_mask.png")

    observation = {k: v[:1] for k, v in batch.items() if k not in (ACTION, "action_is_pad")}  # row 0, no actions
    trace = trace_decoding(policy, observation)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(6, len(trace) * 0.5), 5), sharex=True)
    for step, t in enumerate(trace):
        for rank, (_, p) in enumerate(t["top"]):
            ax1.bar(step + rank * 0.15, p, 0.15, color=f"C{rank}")
    ax1.set(ylabel="probability", title="greedy decoding: top next-token probabilities under the constraint")
    ax2.bar(range(len(trace)), [t["allowed"] for t in trace])
    ax2.set(xlabel="decoding step", ylabel="ids allowed", yscale="log")
    fig.tight_layout()
    save_figure(fig, out_dir / "decoding.png")

    counts = {k: int((kinds[0] == i).sum()) for i, k in enumerate(KINDS)}
    lines = [
        f"policy: {policy.config.preset}, tokenizer {policy.action_tokenizer.name}, T={policy.config.time_horizon}, "
        f"D={policy.config.action_dim}, state as {policy.config.state_encoding}",
        "tokens of row 0: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v),
        f"prompt text: {policy.vocab.text.decode([i for i in seq.input_ids[0].tolist() if i >= 0])!r}",
        f"action ids (training target): {trained[ACTION_IDS][0]}",
        f"decoded greedily: {[t['action_id'] for t in trace if t['action_id'] >= 0]} "
        f"(allowed per step: {[t['allowed'] for t in trace]})",
        "pipeline steps:",
        *(f"  {name}: {', '.join(sorted(str(k) for k in b))}" for name, b in steps),
    ]
    (out_dir / "summary.txt").write_text("\n".join(lines) + "\n")
    return {"tokens": counts, "decoding_steps": len(trace), "out_dir": str(out_dir)}


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="draw one sample's token layout, attention mask and decoding",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy", type=Path, required=True, help="a policy folder (outputs/train/NAME/policy)")
    p.add_argument("--dataset", type=Path, default=None, help="a LeRobot dataset to take the sample from")
    p.add_argument("--index", type=int, default=0, help="the sample's index in the dataset")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: inspect/ beside the policy)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out = args.out or args.policy.parent / "inspect"
    summary = inspect_policy(args.policy, out, args.dataset, args.index)
    print((Path(summary["out_dir"]) / "summary.txt").read_text().rstrip())
    print(f"wrote layout.png, attention_mask.png, decoding.png and summary.txt to {out}")
    return 0
