"""FedRS: missing labels restricted, on hand-made logits."""

from __future__ import annotations

import torch

from neurofed.algorithms.fedrs import restricted_logits


def test_fedrs_restricts_missing_labels_on_hand_made_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = restricted_logits(logits, [5, 0, 2, 0], alpha=0.5)
    assert torch.equal(out, torch.tensor([[1.0, 1.0, 3.0, 2.0]]))
    assert torch.equal(restricted_logits(logits, [0, 0, 1, 1], alpha=1.0), logits)  # alpha = 1 is FedAvg
