"""scripts/profile_cell.py's arithmetic count: the operations of the wrapped calls, forward and backward."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _script():
    sys.path.insert(0, str(REPO / "scripts"))  # profile_cell imports bench_train beside it
    try:
        spec = importlib.util.spec_from_file_location("profile_cell", REPO / "scripts" / "profile_cell.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return module


def test_counted_flops_counts_the_wrapped_calls_forward_and_backward_and_only_them(monkeypatch):
    profile_cell = _script()
    owner = types.ModuleType("fake_model")
    a, w = torch.randn(8, 16), torch.randn(16, 4, requires_grad=True)

    def forward():
        return (a @ w).sum()

    def backward(loss):
        loss.backward()

    owner.forward, owner.backward = forward, backward
    monkeypatch.setitem(sys.modules, "fake_model", owner)
    with profile_cell.counted_flops([("fake_model", "forward"), ("fake_model", "backward")]) as total:
        backward(owner.forward())  # the un-wrapped backward: not counted
        assert total["flops"] == 2 * 8 * 16 * 4  # the forward's product only
        owner.backward(owner.forward())
    product = 2 * 8 * 16 * 4
    # three products in all: the two forwards, and the wrapped backward's gradient of w (a needs none), a^T @ grad
    assert total["flops"] == 3 * product
    assert owner.forward is forward and owner.backward is backward  # put back


def test_matmul_rate_is_a_rate_in_gflops():
    rate = _script().matmul_rate(64, 64, 64, seconds=0.05)
    assert 0.1 < rate < 1e5  # GFLOP/s: any CPU is faster than the first, none reaches the second
