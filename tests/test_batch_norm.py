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


def test_precise_statistics_are_each_norms_mean_over_the_batches_under_the_present_weights():
    from neurofed.models.norm import precise_statistics

    torch.manual_seed(2)
    model = build_model({"name": "sfedca_mnist", "width": 0.25, "norm": "batch"}, (1, 28, 28), 10)
    norms = [m for m in model.modules() if isinstance(m, ChannelBatchNorm)]
    seen = {id(n): [] for n in norms}
    hooks = [n.register_forward_hook(lambda mod, inp, out: seen[id(mod)].append(inp[0].detach())) for n in norms]
    batches = [torch.rand(5, 1, 28, 28, 4) for _ in range(3)]
    weights = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    assert precise_statistics(model, iter(batches)) == 3
    for h in hooks:
        h.remove()
    for n in norms:
        per_batch = [z.transpose(0, 1).reshape(z.shape[1], -1) for z in seen[id(n)]]
        torch.testing.assert_close(n.running_mean, torch.stack([z.mean(1) for z in per_batch]).mean(0))
        torch.testing.assert_close(n.running_var, torch.stack([z.var(1) for z in per_batch]).mean(0))
        assert n.momentum == 0.1  # the tracked average resumes as before in the next training
    assert all(torch.equal(v, weights[k]) for k, v in model.named_parameters() if v.requires_grad)
    assert model.training  # the caller's mode


def test_precise_statistics_close_each_local_training_when_asked():
    """model.norm_statistics: precise: a client's update carries the statistics of its data under
    the weights it trained (what the tracked average only approaches); running: as tracked."""
    from neurofed.config import load_config
    from neurofed.models.norm import precise_statistics
    from neurofed.training.local import encoded_batches, make_optimizer, train_local

    class PlainSgd:  # FedAvg's local step: the optimizer of the config on the cross-entropy
        def make_optimizer(self, model, fed):
            return make_optimizer([p for p in model.parameters() if p.requires_grad], fed)

        def loss(self, model, out, y, x):
            return F.cross_entropy(model.readout(out), y)

        def before_step(self, model, opt):
            pass

        after_step = before_step

    x, y = torch.rand(40, 1, 28, 28), torch.randint(0, 10, (40,))
    stats = {}
    for mode in ("running", "precise"):
        cfg = load_config("examples/papers/sfedca_mnist_dir03.yaml",
                          ["model.width=0.25", "data.timesteps=4", f"model.norm_statistics={mode}",
                           "federation.local_epochs=1", "federation.batch_size=16"])
        torch.manual_seed(3)
        model = build_model({**cfg["model"], "name": "sfedca_mnist"}, (1, 28, 28), 10)
        train_local(model, x, y, cfg, PlainSgd(), seed=0)
        stats[mode] = [(n.running_mean.clone(), n.running_var.clone()) for n in model.modules()
                       if isinstance(n, ChannelBatchNorm)]
        if mode == "precise":
            precise_statistics(model, (xb for _, xb, _ in encoded_batches(model, x, None, cfg["data"], 16,
                                                                            torch.Generator(), shuffle=False)))
            again = [(n.running_mean, n.running_var) for n in model.modules() if isinstance(n, ChannelBatchNorm)]
            for (m1, v1), (m2, v2) in zip(stats[mode], again):  # direct input: the same batches, the same means
                torch.testing.assert_close(m1, m2)
                torch.testing.assert_close(v1, v2)
    assert any(not torch.allclose(a[0], b[0]) for a, b in zip(stats["running"], stats["precise"]))


# --------------------------------------------------------------------------- BNTT (model.norm: bntt)


def test_bntt_normalizes_each_channel_at_each_step_by_that_steps_statistics_and_gamma():
    from neurofed.models.norm import StepBatchNorm

    torch.manual_seed(2)
    steps = 4
    # each step its own mean and spread, as a rate-coded input's early and late steps differ
    z = torch.randn(32, 3, 5, 5, steps) * torch.arange(1.0, steps + 1) + torch.arange(steps) * 3.0
    norm = StepBatchNorm(3, steps)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 13.0).reshape(3, steps) / 4)
    out = norm.train()(z)
    for c in range(3):
        for t in range(steps):
            zc, oc = z[:, c, ..., t], out[:, c, ..., t]
            ref = norm.weight[c, t] * (zc - zc.mean()) / torch.sqrt(zc.var(unbiased=False) + norm.eps)
            torch.testing.assert_close(oc, ref)  # FedSNN Eq. 5: no shift
            torch.testing.assert_close(norm.running_mean[c, t], 0.1 * zc.mean())
    assert [n for n, _ in norm.named_parameters()] == ["weight", "running_mean", "running_var"]
    # each step's γ takes its own gradient
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    assert norm.weight.grad.shape == (3, steps) and len(set(norm.weight.grad.flatten().tolist())) == 3 * steps
    norm.eval()
    whole = norm(z[:6])
    torch.testing.assert_close(whole, torch.cat([norm(z[i:i + 1]) for i in range(6)]))  # running statistics


def test_a_bntt_model_declares_its_per_step_gammas_refuses_export_and_other_step_counts():
    import pytest

    from neurofed.config import ConfigError, load_config
    from neurofed.deploy import DeployError
    from neurofed.deploy.deployable import deployable_copy
    from neurofed.models.norm import StepBatchNorm
    from conftest import tiny_overrides

    cfg = {"name": "sfedca_mnist", "width": 0.25, "norm": "bntt", "norm_steps": 4}
    model = build_model(cfg, (1, 28, 28), 10)
    norms = {f"blocks.{i}.norm.weight": b.norm for i, b in enumerate(model.blocks)
             if isinstance(getattr(b, "norm", None), StepBatchNorm)}
    assert norms and model.param_time_axes == {name: 1 for name in norms}
    assert ParamSpec.from_model(model).time_axes == tuple((name, 1) for name in norms)
    assert all(n.weight.shape[1] == 4 for n in norms.values())
    model.train()(torch.rand(2, 1, 28, 28, 4))
    with pytest.raises(ValueError, match="time steps"):
        model(torch.rand(2, 1, 28, 28, 5))
    with pytest.raises(DeployError, match="model.norm: bntt: one γ per time step"):
        deployable_copy(model)
    twin = build_model({**cfg, "kind": "ann"}, (1, 28, 28), 10)  # the twin takes the plain norm
    assert any(isinstance(m, ChannelBatchNorm) for m in twin.modules())
    assert not any(isinstance(m, StepBatchNorm) for m in twin.modules())
    steps = load_config(None, tiny_overrides())["data"]["timesteps"]
    with pytest.raises(ConfigError, match=rf"model.norm_steps: got {steps + 1} with model.norm bntt; expected "
                                          rf"data.timesteps \({steps}\)"):
        load_config(None, tiny_overrides(**{"model.norm": "bntt", "model.norm_steps": steps + 1, "export": False}))
    with pytest.raises(ConfigError, match=r"export: true with model.norm bntt"):
        load_config(None, tiny_overrides(**{"model.norm": "bntt", "model.norm_steps": steps, "export": True}))
    ok = load_config(None, tiny_overrides(**{"model.norm": "bntt", "model.norm_steps": steps, "export": False}))
    assert ok["model"]["norm_steps"] == steps
    # left null, the steps are the data's: whatever data.timesteps is, and not for the plain norm
    derived = load_config(None, tiny_overrides(**{"model.norm": "bntt", "data.timesteps": steps + 3, "export": False}))
    assert derived["model"]["norm_steps"] == steps + 3
    assert load_config(None, tiny_overrides(**{"model.norm": "batch"}))["model"]["norm_steps"] is None
