"""The seed papers' backbones that the zoo lacked, as layer lists (no SLAYER import here:
config validation lists the zoo).

- ``sfedca_mnist`` — SFedCA's MNIST net, "2 convolutional layers and 2 fully-connected
  layers" (Zhan et al. 2024, Sec. 4.1.1): 20C5-12C5-P2-FC200-FC (valid convolutions, one
  pool). The paper gives no sizes and its code is not public; its own numbers fix the total:
  Table 4's FedAvg (ANN) energy 13.478 µJ at E_MAC = 4.6 pJ (Sec. 4.7, FLOPs = MACs) is
  2.930 M MACs (±109 from the printed digits). Derivation: every 2-conv/2-FC net for 28×28
  input with conv channels in {6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128}, kernels 3 or 5,
  valid or same padding, a 2×2 pool after either conv or not, hidden FC in {32, 50, 64, 84,
  100, 120, 128, 192, 200, 256, 500, 512, 1024}, with or without bias was counted; two fall
  within the printed digits and this one is exact (2,930,000: 288,000 + 2,400,000 + 240,000
  + 2,000). The other is 96C3-P2-20C3-P2-FC500 (2,929,944), a less usual shape. The sizes are
  still neurofed's reading: the count pins the total, not the layers (neurofed's earlier
  32C3-P2-64C3-P2-FC128 was 4.24 M MACs, 19.5 µJ).
- ``sfedca_alexnet`` — SFedCA's CIFAR-10 backbone, "AlexNet" (Sec. 4.1.1), no layer list
  given: 48C3-P2-128C3-P2-192C3-192C3-128C3-FC2048-FC1024-FC, 83.91 M MACs, 386.00 µJ
  against Table 4's 386.308 µJ (83.98 M MACs; −0.08 %). The channels are one GPU's half of
  Krizhevsky et al.'s AlexNet (96-256-384-384-256 split over two GPUs), with 3×3 same
  convolutions and two pools for 32×32 input. Derivation: AlexNet-shaped nets (5 conv + 3 FC;
  channel sets 64-192-384-256-256 (torchvision), 96-256-384-384-256, 48-128-192-192-128 and
  ten smaller ones; first conv 3×3/5×5/11×11 at stride 1, 2 or 4; second 3×3 or 5×5; a 2×2
  pool after conv 1, 2, 5 or not; FC widths in {64 … 4096}) were counted: none lands within
  the printed digits (±109 MACs); among those of AlexNet's form (same-padded convolutions, pools
  after the first two, FC layers of 1024 or more) this is the closest. Shapes that come closer
  (to 0.003 %) need a valid conv 2 and 128–192-wide FC layers. neurofed's earlier
  torchvision-channel net (64-192-384-256-256, FC1024-FC1024) was 172.2 M MACs (792 µJ).
- ``resnet18`` — a spiking ResNet-18 as SFedHIFI's (Tao et al. 2025, "Model Selection":
  SpikingJelly's Spiking-ResNet18; the authors' ``spiking_resnet_flanc.py`` for CIFAR):
  64C3 stem (full width at every p), four stages of two basic blocks with 64/128/256/512·p
  channels and strides 1/2/2/2, global average pool (a SLAYER pool as large as layer4's
  output, 4×4 for 32×32 input: the authors' ``AdaptiveAvgPool2d``; ``model.global_pool:
  analog`` is their analog mean, :class:`neurofed.models.snn.AnalogGlobalPool`), FC; their
  output neuron spikes, as here. Their batch norms: ``model.norm: batch``
  (:mod:`neurofed.models.norm`; folded into weights and biases at export).
- ``hifi_resnet18`` — the same with SFedHIFI's factorized 3×3 convolutions in every basic
  block (Eq. 4, output channels grouped as for ``hifi_cnn``; the authors' ``DecomBlock``),
  the stem and the 1×1 shortcuts plain as theirs.

Residual blocks are two layers (:mod:`neurofed.models.residual`): they train, are
energy-counted and run on Lava as a process graph (:mod:`neurofed.deploy.lava_graph`).
"""

from __future__ import annotations

from functools import partial

from neurofed.models.hifi_cnn import BANK_FRACTION, GROUP_FRACTION
from neurofed.models.spec import Layer, register_topology, same_conv, scaled


def _sfedca_mnist(p: float, k: int) -> list[Layer]:
    return [Layer("conv", scaled(20, p), kernel=5), Layer("conv", scaled(12, p), kernel=5), Layer("pool", kernel=2, stride=2),
            Layer("flatten"), Layer("dense", scaled(200, p)), Layer("dense", k)]


def _sfedca_alexnet(p: float, k: int) -> list[Layer]:
    pool = Layer("pool", kernel=2, stride=2)
    return [same_conv(48, p), pool, same_conv(128, p), pool, same_conv(192, p), same_conv(192, p), same_conv(128, p),
            Layer("flatten"), Layer("dense", scaled(2048, p)), Layer("dense", scaled(1024, p)), Layer("dense", k)]


def _block_conv(out: int, stride: int, factorized: bool, full_in: int, full_out: int, **options) -> Layer:
    if factorized:  # both layers of a block: "factorized_conv" is how SFedHIFI finds its B·M layers
        options = {**options, "block": "factorized_conv", "full_in": full_in, "full_out": full_out,
                   "bank_fraction": BANK_FRACTION, "group_fraction": GROUP_FRACTION}
    return Layer("conv", out, kernel=3, stride=stride, padding=1, options=options)


def _resnet18(p: float, k: int, factorized: bool = False) -> list[Layer]:
    stem = 64
    layers = [Layer("conv", stem, kernel=3, padding=1)]
    channels, full_prev = stem, stem
    for full, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        out = scaled(full, p)
        for b in range(2):
            s = stride if b == 0 else 1
            full_in = full_prev if b == 0 else full
            layers.append(_block_conv(out, s, factorized, full_in, full, residual="open"))
            layers.append(_block_conv(out, 1, factorized, full, full, residual="close",
                                      skip_channels=channels, skip_stride=s))
            channels = out
        full_prev = full
    return layers + [Layer("pool", kernel=0, options={"global_pool": "spikes"}), Layer("flatten"),  # kernel 0: global pool
                   Layer("dense", k)]


register_topology("sfedca_mnist", _sfedca_mnist)
register_topology("sfedca_alexnet", _sfedca_alexnet)
register_topology("resnet18", _resnet18)
register_topology("hifi_resnet18", partial(_resnet18, factorized=True))
