"""netx layer entries as ``neurofed export`` and the residual Lava graph both write them
(:func:`write_layer`): SLAYER's own ``export_hdf5`` where it fits, and what it does not
write: pools as grouped convolutions, the voltage readout, a residual join's 3×3 part and
folded batch-norm biases."""

from __future__ import annotations

import h5py
import numpy as np

from neurofed.deploy.lava_readout import NETX_BIAS_EXP


# Lava's CPU conv model stores ``groups`` as int8 (lava.proc.conv.models, lava-nc
# 0.10): 128 groups wrap to -128 and the layer goes silent without an error.
MAX_LAVA_GROUPS = 127


def pool_groups(channels: int) -> int:
    """Conv groups for a pool over ``channels``: depthwise (= channels) when Lava can
    hold it, else the largest divisor of ``channels`` up to :data:`MAX_LAVA_GROUPS`."""
    return max(g for g in range(1, min(channels, MAX_LAVA_GROUPS) + 1) if channels % g == 0)


def pool_as_conv_weight(pool_weight: np.ndarray, channels: int, groups: int) -> np.ndarray:
    """(channels, channels/groups, k, k) conv weight that pools every channel on its own:
    output channel o sees only input channel o (position o mod group size in its group)."""
    size = channels // groups
    weight = np.zeros((channels, size, *pool_weight.shape[-2:]), dtype=pool_weight.dtype)
    out = np.arange(channels)
    weight[out, out % size] = pool_weight.reshape(pool_weight.shape[-2:])
    return weight


def write_bias(block, group: h5py.Group, index: int) -> None:
    """The block's folded batch-norm shift (:mod:`neurofed.deploy.deployable`) as netx's
    ``bias`` entry: one integer per output channel (netx broadcasts it over the map)."""
    from neurofed.deploy.deployable import integer_bias
    from neurofed.deploy.lava_readout import check_bias

    bias = integer_bias(block.synapse) if getattr(block, "synapse", None) is not None else None
    if bias is None:
        return
    bias = bias.cpu().numpy().astype(np.int32)
    check_bias(bias, f"layer {index}")
    group.create_dataset("bias", data=bias)


def write_pool(block, group: h5py.Group, layer) -> None:
    """A SLAYER Pool block as a grouped conv netx can load (exact; depthwise up to 127
    channels, see :func:`pool_groups`)."""
    c = layer.in_shape[0]
    groups = pool_groups(c)
    syn = block.synapse
    w = syn.pre_hook_fx(syn.weight, descale=True).reshape(syn.weight.shape[:-1]).detach().cpu().numpy()
    group.create_dataset("type", (1,), "S10", [b"conv"])
    group.create_dataset("shape", data=np.array(layer.out_shape))
    group.create_dataset("inChannels", data=c)
    group.create_dataset("outChannels", data=c)
    group.create_dataset("kernelSize", data=np.array(syn.kernel_size[:-1]))
    group.create_dataset("stride", data=np.array(syn.stride[:-1]))
    group.create_dataset("padding", data=np.array(syn.padding[:-1]))
    group.create_dataset("dilation", data=np.array(syn.dilation[:-1]))
    group.create_dataset("groups", data=groups)
    group.create_dataset("weight", data=pool_as_conv_weight(w, c, groups))
    for key, value in block.neuron.device_params.items():
        group.create_dataset(f"neuron/{key}", data=value)


def write_layer(group: h5py.Group, index: int, layer, block, voltage: bool, graded_bits: int = 0,
                bias_exp: int = NETX_BIAS_EXP) -> None:
    """Layer ``index`` of a deployable copy (:mod:`neurofed.deploy.deployable`) into ``group``:
    a pool as a grouped conv, the voltage readout (``voltage``) as a never-firing dense layer,
    a residual join as its 3×3 synapse and neuron (the graph wires its shortcut), anything else
    by SLAYER; then its folded bias, if it has one. ``graded_bits``: the first layer's state runs
    2^bits finer still for graded input (:mod:`neurofed.deploy.lava_plan`), its bias written for
    a neuron of bias exponent ``bias_exp`` (default netx's)."""
    from types import SimpleNamespace

    from neurofed.compat import slayer
    from neurofed.deploy.lava_readout import scale_threshold, write_voltage_layer
    from neurofed.models.quantize import weight_exponent
    from neurofed.models.residual import ResidualJoin

    if layer.kind == "pool":
        write_pool(block, group, layer)
    elif voltage:
        write_voltage_layer(block, group)
    elif isinstance(block, ResidualJoin):
        conv = SimpleNamespace(synapse=block.synapse, neuron=block.neuron, delay=None)
        slayer().block.base.AbstractConv.export_hdf5(conv, group)
    else:
        block.export_hdf5(group)
    write_bias(block, group, index)
    exponent = weight_exponent(block.synapse) if getattr(block, "synapse", None) is not None else 0
    # its weights are 2^k larger integers: its state runs 2^k finer (neurofed.models.quantize), and
    # 2^bits finer on top for graded input. One shift of k + bits: a negative k alone would floor
    # an odd bias that the sum keeps exact (layer_exponent chose k for the sum).
    bits = exponent + graded_bits
    if bits or bias_exp != NETX_BIAS_EXP:
        why = f"layer {index} (exponent {exponent}" + (f", graded input {graded_bits} bits)" if graded_bits else ")")
        scale_threshold(group, bits, bias_exp=bias_exp, why=why)
