#!/usr/bin/env python
"""Regenerate the golden ids in tests/action_tokenizers/golden/ (run it only when a change of ids is intended).

    python scripts/make_golden.py                 # every tokenizer except FSQ (its stored model is kept)
    python scripts/make_golden.py fast beast      # only these
    python scripts/make_golden.py fsq             # retrain and store FSQ's small model too

FAST, binning and BEAST are refitted by the test with the same recipe (fitting is deterministic), so their golden ids
pin the whole fit + encode path. FSQ's training is seeded but floating-point sensitive across machines, so its
small model is stored (safetensors) and the golden ids pin loading + encoding.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import action_tokenizers as at
from action_tokenizers.synthetic import smooth_chunks

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "action_tokenizers" / "golden"


def recipe() -> dict:
    """The fitting data, the probe chunk and the tokenizers the golden ids come from (FSQ excluded)."""
    fit_chunks = smooth_chunks(2000, 10, 7, seed=0)
    probe = smooth_chunks(3, 10, 7, seed=123)
    toks = {
        "fast": at.FASTTokenizer.fit(fit_chunks, scale=10.0, vocab_size=256),
        "fast_byte_level": at.FASTTokenizer.fit(fit_chunks, scale=10.0, vocab_size=256, byte_level=True),
        "bin": at.BinningTokenizer.fit(fit_chunks, n_bins=256),
        "beast": at.BEASTTokenizer.fit(fit_chunks, n_control_points=6, degree=3),
    }
    return {"fit_chunks": fit_chunks, "probe": probe, "tokenizers": toks}


def main() -> None:
    parser = argparse.ArgumentParser(description="regenerate golden ids (only when a change of ids is intended)")
    parser.add_argument("names", nargs="*", help="tokenizers to regenerate (default: all but fsq)")
    args = parser.parse_args()
    r = recipe()
    path = GOLDEN / "ids.json"
    ids = json.loads(path.read_text()) if path.exists() else {}
    names = args.names or list(r["tokenizers"])
    for name in names:
        if name == "fsq":
            fsq = at.FSQTokenizer.fit(
                r["fit_chunks"], hidden=16, depth=0, steps=200, patience=0, seed=0, show_progress=False
            )
            fsq.save_pretrained(GOLDEN / "fsq")
            ids["fsq"] = fsq.encode(r["probe"])
        else:
            ids[name] = r["tokenizers"][name].encode(r["probe"])
    path.write_text(json.dumps(ids) + "\n")
    print(f"wrote {path}: " + ", ".join(f"{k} {len(ids[k][0])} ids" for k in names))


if __name__ == "__main__":
    main()
