"""The seed papers' backbones that the zoo lacked, as layer lists (no SLAYER import here:
config validation lists the zoo).

- ``sfedca_mnist`` — SFedCA's MNIST net, "2 convolutional layers and 2 fully-connected
  layers" (Zhan et al. 2024, Sec. 4.1.1). The paper gives no channel counts and its code is
  not public: neurofed uses 32C3-P2-64C3-P2-FC128-FC (same padding), so the count of
  layers is the paper's and the sizes are neurofed's choice.
- ``sfedca_alexnet`` — SFedCA's CIFAR-10 backbone, "AlexNet" (Sec. 4.1.1), no layer list
  given: AlexNet's five convolutions and three dense layers with torchvision's channels
  64-192-384-256-256, 3×3 kernels with stride 1 for 32×32 input (AlexNet: 11×11 stride 4,
  5×5, then 3×3, for 224×224) and 1024-wide dense layers (AlexNet: 4096):
  64C3-P2-192C3-P2-384C3-256C3-256C3-P2-FC1024-FC1024-FC.
- ``resnet18`` — a spiking ResNet-18 as SFedHIFI's (Tao et al. 2025, "Model Selection":
  SpikingJelly's Spiking-ResNet18; the authors' ``spiking_resnet_flanc.py`` for CIFAR):
  64C3 stem (full width at every p), four stages of two basic blocks with 64/128/256/512·p
  channels and strides 1/2/2/2, global average pool (a SLAYER pool as large as layer4's
  output, 4×4 for 32×32 input: the authors' ``AdaptiveAvgPool2d``), FC; their output neuron
  spikes, as here. No batch norm (netx/Lava have none).
- ``hifi_resnet18`` — the same with SFedHIFI's factorized 3×3 convolutions in every basic
  block (Eq. 4, output channels grouped as for ``hifi_cnn``; the authors' ``DecomBlock``),
  the stem and the 1×1 shortcuts plain as theirs.

Residual blocks are two layers (:mod:`neurofed.models.residual`): they train and are
energy-counted; ``neurofed export`` refuses them with the reason.
"""

from __future__ import annotations

from functools import partial

from neurofed.models.hifi_cnn import BANK_FRACTION, GROUP_FRACTION
from neurofed.models.spec import Layer, _conv, _w, register_topology


def _sfedca_mnist(p: float, k: int) -> list[Layer]:
    pool = Layer("pool", kernel=2, stride=2)
    return [_conv(32, p), pool, _conv(64, p), pool, Layer("flatten"), Layer("dense", _w(128, p)), Layer("dense", k)]


def _sfedca_alexnet(p: float, k: int) -> list[Layer]:
    pool = Layer("pool", kernel=2, stride=2)
    return [_conv(64, p), pool, _conv(192, p), pool, _conv(384, p), _conv(256, p), _conv(256, p), pool,
            Layer("flatten"), Layer("dense", _w(1024, p)), Layer("dense", _w(1024, p)), Layer("dense", k)]


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
        out = _w(full, p)
        for b in range(2):
            s = stride if b == 0 else 1
            full_in = full_prev if b == 0 else full
            layers.append(_block_conv(out, s, factorized, full_in, full, residual="open"))
            layers.append(_block_conv(out, 1, factorized, full, full, residual="close",
                                      skip_channels=channels, skip_stride=s))
            channels = out
        full_prev = full
    return layers + [Layer("pool", kernel=0), Layer("flatten"), Layer("dense", k)]  # kernel 0: global pool


register_topology("sfedca_mnist", _sfedca_mnist)
register_topology("sfedca_alexnet", _sfedca_alexnet)
register_topology("resnet18", _resnet18)
register_topology("hifi_resnet18", partial(_resnet18, factorized=True))
