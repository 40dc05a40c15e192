"""Network topologies as data: one layer list builds the SNN, its ANN twin, the
netx export and the energy count, so the four can never disagree.

A topology is a list of :class:`Layer`; :func:`topology` returns the zoo entry for a
name, width multiplier ``p`` (hidden channels/features scaled, input and output
kept) and input shape, with every layer's input and output shape resolved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from neurofed.registry import Registry

KINDS = ("conv", "pool", "flatten", "dense")


@dataclass(frozen=True)
class Layer:
    kind: str  # conv | pool | flatten | dense
    out: int = 0  # output channels (conv) or features (dense)
    kernel: int = 1
    stride: int = 1
    padding: int = 0
    in_shape: tuple = ()  # (C, H, W) or (F,), resolved by ``resolve``
    out_shape: tuple = ()
    options: dict = field(default_factory=dict, compare=False)  # block-specific (e.g. factorized conv)

    @property
    def has_neurons(self) -> bool:
        return self.kind != "flatten"

    @property
    def num_neurons(self) -> int:
        return math.prod(self.out_shape) if self.has_neurons else 0


def resolve(layers: list[Layer], input_shape: tuple[int, int, int]) -> list[Layer]:
    """Fill in every layer's input and output shape; raise on impossible sizes."""
    shape = tuple(input_shape)
    out = []
    for i, layer in enumerate(layers):
        if layer.kind == "conv":
            c, h, w = shape
            ho = (h + 2 * layer.padding - layer.kernel) // layer.stride + 1
            wo = (w + 2 * layer.padding - layer.kernel) // layer.stride + 1
            new = (layer.out, ho, wo)
        elif layer.kind == "pool":
            c, h, w = shape
            if layer.kernel == 0:  # global average pool: the kernel is the input's size
                layer = replace(layer, kernel=h, stride=h)
            if min(h, w) >= layer.kernel and (h % layer.kernel or w % layer.kernel):
                # SLAYER's pool pads an odd map (11 -> 6) where this count floors (11 -> 5), so the
                # next layer's size would disagree with the trained net's.
                raise ValueError(f"layer {i} (pool {layer.kernel}x{layer.kernel}) gets a {h}x{w} map, which "
                                 f"{layer.kernel} does not divide; allowed: map sizes that are multiples of the "
                                 "pool's kernel (change the conv before it)")
            new = (c, h // layer.kernel, w // layer.kernel)
        elif layer.kind == "flatten":
            new = (math.prod(shape),)
        elif layer.kind == "dense":
            if len(shape) != 1:
                raise ValueError(f"layer {i} (dense) needs a flat input; add a flatten layer before it")
            new = (layer.out,)
        else:
            raise ValueError(f"layer {i}: unknown kind {layer.kind!r}; allowed: {', '.join(KINDS)}")
        if min(new) < 1:
            raise ValueError(f"layer {i} ({layer.kind}) would shrink {'x'.join(map(str, shape))} to "
                             f"{'x'.join(map(str, new))}: the input is too small for this model")
        out.append(replace(layer, in_shape=shape, out_shape=new))
        shape = new
    return out


def shortcut_layer(layer: Layer, skip_shape: tuple) -> Layer | None:
    """The 1×1 strided conv shortcut of a residual close layer (``options["residual"] ==
    "close"``) whose block input had ``skip_shape``, as a resolved layer; None for the identity."""
    stride = layer.options.get("skip_stride", 1)
    if stride == 1 and skip_shape[0] == layer.out:
        return None
    return Layer("conv", layer.out, kernel=1, stride=stride, in_shape=tuple(skip_shape),
                 out_shape=tuple(layer.out_shape))


def scaled(n: int, p: float) -> int:
    """``n`` channels or units at width multiplier ``p`` (at least 1)."""
    return max(1, int(round(n * p)))


def same_conv(n, p, k=3):
    """A ``k``x``k`` conv of ``n`` channels at width ``p``, padded to keep the map size."""
    return Layer("conv", scaled(n, p), kernel=k, padding=k // 2)


def _mlp(p, k):
    return [Layer("flatten"), Layer("dense", scaled(128, p)), Layer("dense", k)]


def _cnn(p, k):
    # The digits default: small enough for 2 CPU cores, even spatial sizes for pool export.
    return [same_conv(16, p), Layer("pool", kernel=2, stride=2), same_conv(32, p),
            Layer("flatten"), Layer("dense", scaled(64, p)), Layer("dense", k)]


def _vgg5(p, k):
    return [same_conv(64, p), Layer("pool", kernel=2, stride=2), same_conv(128, p), same_conv(128, p),
            Layer("pool", kernel=2, stride=2), Layer("flatten"), Layer("dense", scaled(1024, p)),
            Layer("dense", k)]


def _svgg9(p, k):
    # FedSNN's VGG9 (Venkatesha et al. 2021): 64,64,P,128,128,P,256,256,256,P, fc1024, fcK.
    pool = Layer("pool", kernel=2, stride=2)
    return [same_conv(64, p), same_conv(64, p), pool, same_conv(128, p), same_conv(128, p), pool,
            same_conv(256, p), same_conv(256, p), same_conv(256, p), pool, Layer("flatten"),
            Layer("dense", scaled(1024, p)), Layer("dense", k)]


# name -> topology (width multiplier, number of classes) -> layers
ZOO = Registry("model.name", "model", {"mlp": _mlp, "cnn": _cnn, "vgg5": _vgg5, "svgg9": _svgg9})


def register_topology(name: str, fn: Callable[[float, int], list[Layer]]) -> None:
    ZOO.register(name, fn)


def topology(name: str, width: float, num_classes: int, input_shape: tuple[int, int, int]) -> list[Layer]:
    make = ZOO.lookup(name)
    try:
        return resolve(make(width, num_classes), input_shape)
    except ValueError as exc:  # one line naming the model and the input, before any training
        raise ValueError(f"model.name: {name} does not fit {'x'.join(map(str, input_shape))} input: {exc}") from None
