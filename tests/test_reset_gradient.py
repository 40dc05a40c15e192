"""model.neuron_gradient: spikingjelly — SLAYER's forward, SpikingJelly's backward (SFedCA Eq. 10)."""

from __future__ import annotations

import math

import pytest
import torch

from neurofed.compat import slayer as _slayer
from neurofed.models import build_model
from neurofed.models.reset_gradient import ResetGradientNeuron, use_reset_gradient

slayer = _slayer()


def _atan_step(alpha):
    class Step(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return (x >= 0).double()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (alpha / 2) / (1 + (math.pi / 2 * alpha * x) ** 2)
    return Step.apply


def _spikingjelly_if(current, threshold, keep, alpha):
    """SpikingJelly's node written out for autograd: h = keep·v + I, s = Θ(h − θ), v = h·(1 − s)."""
    step, v, out = _atan_step(alpha), torch.zeros_like(current[..., 0]), []
    for t in range(current.shape[-1]):
        h = keep * v + current[..., t]
        s = step(h - threshold)
        v = h * (1 - s)  # the reset is differentiated (detach_reset=False)
        out.append(s)
    return torch.stack(out, -1)


@pytest.mark.parametrize("voltage_decay", [0.0, 0.25])
def test_the_gradient_is_spikingjelly_nodes_and_the_spikes_are_slayers(voltage_decay):
    torch.manual_seed(0)
    # currents on SLAYER's 1/64 grid, so its fixed-point voltage is the float one (exact with no leak)
    current = torch.round(torch.randn(6, 5, 12) * 64 * 0.8) / 64
    params = dict(threshold=1.0, current_decay=1.0, voltage_decay=voltage_decay, tau_grad=0.3, scale_grad=30.0,
                  shared_param=True, requires_grad=False)
    stock = slayer.neuron.cuba.Neuron(**params)
    neuron = slayer.neuron.cuba.Neuron(**params)
    neuron.__class__ = ResetGradientNeuron
    x = current.clone().requires_grad_()
    spikes = neuron(x)
    assert torch.equal(spikes, stock(current))  # the forward is SLAYER's
    weights = torch.randn_like(spikes)
    (spikes * weights).sum().backward()

    ref_x = current.double().requires_grad_()
    ref = _spikingjelly_if(ref_x, 1.0, 1 - voltage_decay, 2.0)
    assert torch.equal(ref.float(), spikes)
    (ref * weights.double()).sum().backward()
    tol = 1e-5 if voltage_decay == 0 else 1e-2  # float32 sums; with a leak SLAYER rounds the voltage to 1/64
    assert torch.allclose(x.grad.double(), ref_x.grad, atol=tol * ref_x.grad.abs().max().item())
    assert spikes.sum() > 0 and x.grad.abs().sum() > 0

    # and it is not SLAYER's own gradient
    y = current.clone().requires_grad_()
    (stock(y) * weights).sum().backward()
    assert not torch.allclose(y.grad, x.grad, atol=1e-3)


def test_the_option_sets_every_conv_and_dense_neuron_and_leaves_the_pools():
    cfg = {"name": "sfedca_mnist", "threshold": 1.0, "current_decay": 1.0, "voltage_decay": 0.0,
           "pool": "max", "norm": "batch", "neuron_gradient": "spikingjelly", "atan_alpha": 2.0}
    model = build_model(cfg, (1, 28, 28), 10, logit_scale=12.0)
    kinds = {layer.kind: type(block.neuron).__name__ for layer, block in zip(model.layers, model.blocks)
             if hasattr(block, "neuron")}
    assert kinds == {"conv": "ResetGradientNeuron", "dense": "ResetGradientNeuron", "pool": "Neuron"}
    plain = build_model({**cfg, "neuron_gradient": "slayer"}, (1, 28, 28), 10, logit_scale=12.0)
    plain.load_state_dict(model.state_dict())
    x = torch.rand(4, 1, 28, 28, 12)
    model.eval(), plain.eval()
    assert torch.equal(model(x), plain(x))  # same forward, so the same export and Lava run


def test_only_cuba_neurons_take_it():
    block = torch.nn.Module()
    block.neuron = slayer.neuron.cuba.Neuron(threshold=1.0, current_decay=1.0, voltage_decay=0.0)
    use_reset_gradient(block, 3.0)
    assert isinstance(block.neuron, ResetGradientNeuron) and block.neuron.atan_alpha == 3.0
    block.neuron = slayer.neuron.sigma_delta.Neuron(threshold=1.0, activation=torch.relu)
    with pytest.raises(TypeError, match="CUBA"):
        use_reset_gradient(block, 2.0)


def test_a_model_trained_with_it_exports_and_runs_spike_for_spike_in_lava(tmp_path):
    from test_deploy import assert_round_trip, random_spikes, tiny_model

    model = tiny_model("cnn", neuron_gradient="spikingjelly")
    assert type(model.blocks[0].neuron).__name__ == "ResetGradientNeuron"
    # one SGD step, so that the exported weights are the new gradient's
    model.train()
    x = torch.as_tensor(random_spikes(8)).float()
    loss = torch.nn.functional.cross_entropy(model.readout(model(x)), torch.arange(8) % 10)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    assert_round_trip(model.eval(), random_spikes(3), tmp_path / "sj.net")
