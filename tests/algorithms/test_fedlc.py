"""FedLC: the calibrated logits on hand-made logits."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import pytest

from neurofed.algorithms.fedlc import calibrated_logits


def test_fedlc_calibration_on_hand_made_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], requires_grad=True)
    counts = [16, 1, 0]
    out = calibrated_logits(logits, counts, tau=2.0)
    # 16^(-1/4) = 1/2, 1^(-1/4) = 1, missing label -> -inf
    assert torch.equal(out[:, :2], torch.tensor([[0.0, 0.0], [-0.5, -1.5]]))
    assert torch.isinf(out[:, 2]).all() and (out[:, 2] < 0).all()
    loss = F.cross_entropy(out, torch.tensor([0, 1]))
    expected = -math.log(0.5) - math.log(math.exp(-1.5) / (math.exp(-0.5) + math.exp(-1.5)))
    assert float(loss.detach()) == pytest.approx(expected / 2, rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and torch.all(logits.grad[:, 2] == 0)
