"""Batch norm between a SLAYER block's synapse and its neuron (``model.norm: batch``).

The SFedHIFI authors' Spiking-ResNet18 (``spiking_resnet_flanc.py``) normalizes every
convolution's output before its spiking neuron (``sn1(bn1(conv1(x)))``, and ``bn2`` and the
1×1 shortcut's BN before the sum of a basic block). SpikingJelly runs those BNs on the
time-flattened tensor, so each channel's statistics are taken over the batch, the map and
all T steps: here ``F.batch_norm`` on SLAYER's (N, C, ..., T) layout does exactly that.

Statistics: training normalizes with the batch's own (as before running statistics were
added: the training forward and gradients are unchanged), and tracks running means and
variances (PyTorch's momentum 0.1, unbiased variance); evaluation normalizes with those, as
PyTorch's ``BatchNorm`` in ``eval()`` and SpikingJelly's do, so that a model's evaluation
does not depend on the batch it runs in and the network folded for export
(:meth:`ChannelBatchNorm.affine`) is the evaluated one. The running statistics are
parameters that take no gradient, named in ``neurofed.training.params.FEDERATED_STATISTICS``: the
server averages them with the weights (within a width, for SFedHIFI). HeteroFL's "static
batch norm" (Diao et al. 2021, ICLR, §3: batch statistics at evaluation too) was this
module's form before; docs/fidelity.md says what the change does to the evaluation figures.

Without the norm, SLAYER's ResNet-18 does not learn (measured on the CIFAR-10 stand-in at
width 0.125, one model fitting one batch of 64: 30 % after 60 Adam steps, vs 72 % with the
norm and 98 % with the norm and the analog global pool; the S-VGG9, which has no residual
path, fits it in 40). Export folds the norm into the weights and a bias
(:mod:`neurofed.deploy.deployable`); :data:`EXPORT_REFUSAL` is what a reader of the unfolded
block (the NIR export) says.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from neurofed.compat import slayer as _slayer
from neurofed.models.factorized import FactorizedConv

slayer = _slayer()

EXPORT_REFUSAL = ("model.norm: batch: an unfolded norm; export folds it into weight scales and a bias "
                  "(neurofed.deploy.deployable.deployable_copy)")


class ChannelBatchNorm(nn.Module):
    """Per-channel batch norm of an (N, C, ..., T) tensor over every axis but C: the batch's
    statistics in training (which also updates the running ones), the running statistics in
    evaluation; affine scale 1 and shift 0 at the start (PyTorch's)."""

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.running_mean = nn.Parameter(torch.zeros(channels), requires_grad=False)
        self.running_var = nn.Parameter(torch.ones(channels), requires_grad=False)
        self.eps = eps
        self.momentum = momentum

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(z, self.running_mean, self.running_var, self.weight, self.bias,
                            training=self.training, momentum=self.momentum, eps=self.eps)

    @torch.no_grad()
    def affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, shift) per channel with evaluation's ``norm(z) == scale * z + shift``: what
        folds into the synapse's weights (x scale per output channel) and a bias."""
        scale = self.weight / torch.sqrt(self.running_var + self.eps)
        return scale, self.bias - scale * self.running_mean


BNTT_EXPORT_REFUSAL = ("model.norm: bntt: one γ per time step, which a synapse that is the same at every step "
                       "cannot fold; train with model.norm: batch to export")


class StepBatchNorm(ChannelBatchNorm):
    """BNTT (Kim & Panda 2021; FedSNN §II-C, Eq. 5): one γ and one set of statistics per
    channel *and time step*, ``γ_i^t (z_i^t − μ_i^t) / sqrt(σ_i^t² + ε)``, and no shift, as
    Eq. 5 is printed; ε and the statistics' momentum are PyTorch's. ``model.norm: bntt``, a
    training-only form: a Loihi synapse is the same at every step, so a per-step γ cannot fold
    into it, and export refuses it (:func:`neurofed.deploy.deployable.deployable_copy`); ``model.norm: batch`` is
    the form that folds. γ and the statistics are (C, T); the model declares γ's time axis
    (``param_time_axes``), which FedLEC's Aggregation Through Time averages over."""

    def __init__(self, channels: int, steps: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(channels, eps, momentum)
        self.steps = int(steps)
        self.weight = nn.Parameter(torch.ones(channels, self.steps))
        self.bias = None
        self.running_mean = nn.Parameter(torch.zeros(channels, self.steps), requires_grad=False)
        self.running_var = nn.Parameter(torch.ones(channels, self.steps), requires_grad=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.shape[-1] != self.steps:
            raise ValueError(f"model.norm: bntt: the input has {z.shape[-1]} time steps; its γ and "
                             f"statistics hold {self.steps} (model.norm_steps = data.timesteps)")
        n, c = z.shape[:2]
        per_step = z.movedim(-1, 2)  # (N, C, T, ...): each (channel, step) a channel of its own
        flat = per_step.reshape(n, c * self.steps, *per_step.shape[3:])
        out = F.batch_norm(flat, self.running_mean.view(-1), self.running_var.view(-1), self.weight.reshape(-1),
                           None, training=self.training, momentum=self.momentum, eps=self.eps)
        return out.reshape(per_step.shape).movedim(2, -1)

    def affine(self):
        raise ValueError(BNTT_EXPORT_REFUSAL)


class BatchNormed:
    """Mixin before a SLAYER block class: its ``forward`` (``base.AbstractConv``'s and
    ``AbstractDense``'s: synapse, neuron, one-step delay) with ``self.norm`` between the
    synapse and the neuron. The neuron itself is untouched, so it keeps neurofed's fused
    kernel (:mod:`neurofed.kernels`)."""

    export_refusal = EXPORT_REFUSAL
    exports_as_base = False  # a factorized conv exports as a plain conv; normed, it does not

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.neuron(self.norm(self.synapse(x)))
        if self.delay_shift is True:
            x = slayer.block.base.step_delay(self, x)
        if self.delay is not None:
            x = self.delay(x)
        return (x, torch.mean(x > 0)) if self.count_log is True else x


class BatchNormedConv(BatchNormed, slayer.block.cuba.Conv):
    pass


class BatchNormedFactorizedConv(BatchNormed, FactorizedConv):
    pass


class BatchNormedDense(BatchNormed, slayer.block.cuba.Dense):
    pass


# Module-level classes (not made on the fly), so that normed models pickle across processes.
NORMED = {slayer.block.cuba.Conv: BatchNormedConv, FactorizedConv: BatchNormedFactorizedConv,
          slayer.block.cuba.Dense: BatchNormedDense}


def batch_normed(block: nn.Module, steps: int | None = None) -> nn.Module:
    """``block`` (a SLAYER CUBA Conv or Dense, or a factorized conv) with a
    :class:`ChannelBatchNorm` before its neuron, or with ``steps`` a :class:`StepBatchNorm`
    (BNTT); its parameters keep their names."""
    try:
        block.__class__ = NORMED[type(block)]
    except KeyError:
        raise ValueError(f"model.norm: batch: no normed form of {type(block).__name__}; "
                         f"known: {', '.join(c.__name__ for c in NORMED)}") from None
    channels = block.synapse.out_channels
    block.norm = ChannelBatchNorm(channels) if steps is None else StepBatchNorm(channels, steps)
    if steps is not None:
        block.export_refusal = BNTT_EXPORT_REFUSAL
    return block


@torch.no_grad()
def precise_statistics(model: nn.Module, batches) -> int:
    """Replace each :class:`ChannelBatchNorm`'s running mean and variance by their average
    over ``batches`` (encoded inputs) under the model's present weights; returns the batches
    used. ``model.norm_statistics: precise`` (Wu & Johnson, "Rethinking 'Batch' in BatchNorm",
    2021: PreciseBN). Why: the running statistics average the last ~10 batches of training,
    each under weights an SGD step older; a spiking layer turns that lag into spikes that
    cross or miss the threshold. On the SFedCA MNIST net (60,000 images, 3 epochs, SGD 0.1)
    evaluation with the tracked statistics scored 94.8 % on the first 2,000 test images,
    with statistics recomputed over 10,000 training images 97.35 %. The rest of the model
    runs in evaluation mode (no dropout); each norm's momentum is restored."""
    used = 0
    with normalizing_by_batch(model) as norms:
        if not norms:  # nothing to recompute: no pass over the data
            return 0
        momenta = [n.momentum for n in norms]
        try:
            for xb in batches:
                used += 1
                for n in norms:  # the k-th batch weighs 1/k: the running value is the mean so far
                    n.momentum = 1.0 / used
                model(xb)
        finally:
            for n, m in zip(norms, momenta):
                n.momentum = m
    return used


@contextmanager
def normalizing_by_batch(model: nn.Module):
    """``model`` in evaluation mode (no dropout, no state kept) except its
    :class:`ChannelBatchNorm` s, which normalize with each batch's own statistics and update
    their running ones, as in training; yields those norms; restores the caller's mode."""
    norms = [m for m in model.modules() if isinstance(m, ChannelBatchNorm)]
    was_training = model.training
    model.eval()
    for n in norms:
        n.train()
    try:
        yield norms
    finally:
        model.train(was_training)


@contextmanager
def as_training_starts(model: nn.Module):
    """``model`` as its first training step sees a batch, without training it: the norms on
    the batch's own statistics (at the start their running ones are 0 and 1, which no
    trained step uses), the rest in evaluation mode; the running statistics are left as
    they were."""
    with normalizing_by_batch(model) as norms:
        kept = [(n.running_mean.detach().clone(), n.running_var.detach().clone()) for n in norms]
        try:
            yield model
        finally:
            with torch.no_grad():
                for n, (mean, var) in zip(norms, kept):
                    n.running_mean.copy_(mean)
                    n.running_var.copy_(var)
