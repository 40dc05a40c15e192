"""netx entries that SLAYER's own ``export_hdf5`` does not write as Lava must run them.

- The voltage readout (``model.readout: voltage``): SLAYER's ``Affine`` block, a neuron
  that never spikes (threshold -1 switches spike and reset off). netx has no such neuron;
  a CUBA neuron with its largest threshold mantissa and the block's decays is the same
  integrator as long as its voltage stays below that threshold (2^23 - 64 in Lava's
  24-bit state: 2047 in SLAYER units; the constraint check warns beyond it). Lava reads
  its voltage at each sample's last step (:mod:`neurofed.deploy.lava_procs.readout`).
- Graded input: the first layer's threshold mantissa times 2^input_bits
  (:mod:`neurofed.deploy.lava_plan`).
"""

from __future__ import annotations

import h5py
import numpy as np

from neurofed.deploy import DeployError
from neurofed.models.quantize import MAX_BIAS_MANTISSA, MAX_THRESHOLD_MANTISSA  # noqa: F401  (read from here too)


def check_bias(bias: np.ndarray, where: str) -> None:
    """A bias netx writes as Lava's 13-bit mantissa (netx fixes its exponent at 6), or a refusal."""
    worst = int(np.abs(bias).max()) if np.size(bias) else 0
    if worst > MAX_BIAS_MANTISSA:
        raise DeployError(f"{where}: folded batch-norm bias {worst} (in 1/64 current units) passes Lava's 13-bit "
                          f"bias mantissa (|b| <= {MAX_BIAS_MANTISSA}); the layer's norm shift is too large to map")


def write_voltage_layer(block, group: h5py.Group) -> None:
    """A SLAYER ``Affine`` block as a netx dense layer whose neuron never reaches threshold."""
    from neurofed.deploy.constraints import integer_weight

    syn = block.synapse
    weight = integer_weight(syn).reshape(syn.out_channels, -1).cpu().numpy()
    group.create_dataset("type", (1,), "S10", [b"dense"])
    group.create_dataset("shape", data=np.array([syn.out_channels]))
    group.create_dataset("weight", data=weight)
    neuron = block.neuron
    params = {"type": "CUBA", "iDecay": neuron.cx_current_decay, "vDecay": neuron.cx_voltage_decay,
              "vThMant": MAX_THRESHOLD_MANTISSA, "refDelay": 1, "gradedSpike": False}
    for key, value in params.items():
        group.create_dataset(f"neuron/{key}", data=value)


NETX_BIAS_EXP = 6  # netx's hdf5 reader gives every neuron this bias exponent
MAX_BIAS_EXP = 7  # Lava LIF's bias_exp: unsigned 3 bits


def shift(a, bits: int):
    """Integers ``a`` x 2^bits (a negative ``bits`` only where exact, as the exponents are chosen)."""
    return np.left_shift(a, bits) if bits >= 0 else np.right_shift(a, -bits)


def graded_bias(bias, bits: int, bias_exp: int):
    """A bias (integer, input units) as the mantissa of a neuron whose state is 2^bits finer
    and whose bias exponent is ``bias_exp``."""
    return shift(bias, bits - (bias_exp - NETX_BIAS_EXP))


def scale_threshold(group: h5py.Group, bits: int, bias_exp: int = NETX_BIAS_EXP,
                    why: str = "layer 0 (graded input)") -> None:
    """Layer entry ``group``'s threshold mantissa and bias x 2^bits: its state runs 2^bits finer
    (graded input, or the layer's exponent: :mod:`neurofed.models.quantize`). The bias is written
    for a neuron with exponent ``bias_exp`` (netx's 6, or up to Lava's 7 where the caller sets it:
    twice the range). The voltage readout's threshold stays at its largest mantissa."""
    if "bias" in group:
        bias = graded_bias(np.asarray(group["bias"][()]), bits, bias_exp)
        del group["bias"]
        check_bias(bias, f"{why}: its bias x 2^{bits}, exponent {bias_exp}")
        group.create_dataset("bias", data=bias)
    current = np.asarray(group["neuron/vThMant"][()])
    if int(current.max()) == MAX_THRESHOLD_MANTISSA:
        return  # the voltage readout: it must never fire
    data = shift(current, bits)
    if int(data.max()) > MAX_THRESHOLD_MANTISSA:
        raise DeployError(f"{why}: its state 2^{bits} finer scales the threshold mantissa to {int(data.max())}, "
                          f"beyond Lava's {MAX_THRESHOLD_MANTISSA} (17 bits); lower the threshold")
    del group["neuron/vThMant"]
    group.create_dataset("neuron/vThMant", data=data)
