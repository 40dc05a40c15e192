"""model.norm: batch with running statistics: training unchanged, evaluation with the
running statistics (independent of the batch), the server averages them, and the fold
for export is the evaluated norm."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from neurofed.training.params import ParamSpec
from neurofed.models import build_model
from neurofed.models.norm import ChannelBatchNorm


def test_training_forward_and_gradients_are_those_of_batch_statistics_alone():
    torch.manual_seed(0)
    z = torch.randn(4, 3, 5, 5, 6) * 2 + 1
    norm = ChannelBatchNorm(3)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    a, b = z.clone().requires_grad_(), z.clone().requires_grad_()
    out = norm.train()(a)
    ref = F.batch_norm(b, None, None, norm.weight, norm.bias, training=True, eps=norm.eps)  # the form before
    assert torch.equal(out, ref)
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    (ref * torch.arange(ref.numel()).reshape(ref.shape)).sum().backward()
    assert torch.equal(a.grad, b.grad)
    assert norm.running_mean.grad is None and norm.running_var.grad is None  # never trained
    # and the running statistics moved towards the batch's (momentum 0.1, unbiased variance)
    mean = z.transpose(0, 1).reshape(3, -1).mean(1)
    var = z.transpose(0, 1).reshape(3, -1).var(1)
    torch.testing.assert_close(norm.running_mean, 0.1 * mean)
    torch.testing.assert_close(norm.running_var, 0.9 + 0.1 * var)


def test_evaluation_uses_the_running_statistics_whatever_the_batch():
    torch.manual_seed(1)
    norm = ChannelBatchNorm(3)
    for _ in range(20):
        norm.train()(torch.randn(8, 3, 4, 4, 5) * 3 + 2)
    norm.eval()
    z = torch.randn(6, 3, 4, 4, 5)
    whole = norm(z)
    alone = torch.cat([norm(z[i:i + 1]) for i in range(len(z))])  # a sample's output does not depend on its batch
    assert torch.equal(whole, alone)
    scale, shift = norm.affine()  # the fold export uses
    torch.testing.assert_close(whole, scale.reshape(1, -1, 1, 1, 1) * z + shift.reshape(1, -1, 1, 1, 1))


def test_running_statistics_travel_with_the_global_model():
    model = build_model({"name": "sfedca_mnist", "width": 0.25, "norm": "batch"}, (1, 28, 28), 10)
    spec = ParamSpec.from_model(model)
    stats = [n for n in spec.names if n.endswith(("running_mean", "running_var"))]
    assert stats and all(not dict(model.named_parameters())[n].requires_grad for n in stats)
    model.train()(torch.rand(2, 1, 28, 28, 4))
    flat = spec.get(model)
    fresh = build_model({"name": "sfedca_mnist", "width": 0.25, "norm": "batch"}, (1, 28, 28), 10)
    spec.set(fresh, flat)
    for name in stats:
        np.testing.assert_array_equal(dict(fresh.named_parameters())[name].detach().numpy(),
                                      dict(model.named_parameters())[name].detach().numpy())
