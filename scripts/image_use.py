"""Does a camera policy use its camera? Three measurements on a policy and its training data:

- the training loss on real frames against the same batch with blank (all-zero) and noise images: a policy that reads
  its camera loses more without it;
- the image tokens the decoder reads (after the projector): their size, and how much they vary between the tokens of
  one image (a vision tower that has collapsed gives every token the same large vector);
- the spread of the first action over episode starts (different layouts): a policy that ignores the camera gives
  every layout the same first action, while the expert's differ.

    python scripts/image_use.py --policy RUN/policy --dataset DATASET --out results/vision/image_use.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from vla.data.torch_dataset import ActionChunkDataset
from vla.io import write_json
from vla.policy import VLAPolicy
from vla.policy.pipeline import IMAGES, run
from vla.provenance import provenance


def measure(policy: VLAPolicy, dataset: str | Path, starts: int = 40, batch: int = 32) -> dict:
    config = policy.config
    if not config.image_keys:
        raise SystemExit("the policy reads no camera (image_keys is empty); nothing to measure")
    keys = list(config.image_keys)
    ds = ActionChunkDataset(
        dataset, config.time_horizon, image_keys=keys, backend="memory", obs_steps=config.n_obs_steps, progress=False
    )
    rows = np.linspace(0, len(ds) - 1, batch).round().astype(int)
    samples = torch.utils.data.default_collate([ds[int(i)] for i in rows])
    torch.manual_seed(0)
    losses = {}
    with torch.no_grad():
        for name, change in (("real", lambda x: x), ("blank", torch.zeros_like), ("noise", torch.rand_like)):
            losses[name] = float(policy.forward({**samples, **{k: change(samples[k]) for k in keys}})[0])
        images = run(policy.pipeline.measuring, samples)[IMAGES]
        tokens = policy.model.image_features(images)
    first = np.flatnonzero(ds._frames["frame_in_episode"] == 0)[:starts]
    predicted, expert = [], []
    for i in first:
        s = ds[int(i)]
        obs = {k: v[None] for k, v in s.items() if k.startswith("observation.")} | {"task": [s["task"]]}
        with torch.no_grad():
            predicted.append(policy.predict_action_chunk(obs)[0, 0].numpy())
        expert.append(s["action"][0].numpy())
    return {
        "loss": losses,
        "image_token_norm": float(tokens.norm(dim=-1).mean()),
        "image_token_spread": float(tokens.std(dim=1).mean()),  # std over the tokens of one image, mean over dims
        "first_action_std": {"policy": np.std(predicted, axis=0).tolist(), "expert": np.std(expert, axis=0).tolist()},
        "episode_starts": len(first),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--dataset", type=Path, required=True, help="the policy's training data (LeRobot v3.0)")
    p.add_argument("--out", type=Path, required=True, help="a JSON file; several policies: run once per policy")
    args = p.parse_args()
    result = {"policy": str(args.policy), **measure(VLAPolicy.from_pretrained(args.policy).eval(), args.dataset)}
    result["provenance"] = provenance(config={"policy": str(args.policy)}, dataset=args.dataset)
    write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
