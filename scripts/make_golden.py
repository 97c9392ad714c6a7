#!/usr/bin/env python
"""Regenerate the golden ids in tests/action_tokenizers/golden/ (run it only when a change of ids is intended).

    python scripts/make_golden.py

FAST and binning are refitted by the test with the same recipe (fitting is deterministic), so their golden ids
pin the whole fit + encode path. FSQ's training is seeded but floating-point sensitive across machines, so its
small model is stored (safetensors) and the golden ids pin loading + encoding.
"""

from __future__ import annotations

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
    }
    return {"fit_chunks": fit_chunks, "probe": probe, "tokenizers": toks}


def main() -> None:
    r = recipe()
    fsq = at.FSQTokenizer.fit(r["fit_chunks"], hidden=16, depth=0, steps=200, seed=0, show_progress=False)
    fsq.save_pretrained(GOLDEN / "fsq")
    ids = {name: tok.encode(r["probe"]) for name, tok in r["tokenizers"].items()}
    ids["fsq"] = fsq.encode(r["probe"])
    (GOLDEN / "ids.json").write_text(json.dumps(ids) + "\n")
    print(f"wrote {GOLDEN / 'ids.json'}: " + ", ".join(f"{k} {len(v[0])} ids" for k, v in ids.items()))


if __name__ == "__main__":
    main()
