"""The papers' energy formulas, next to neurofed's exact count (``energy.convention``).

``exact`` (the default) prices the measured synaptic operations of every layer with
synapses, pools included (:mod:`neurofed.models.opcounts`). ``paper`` makes a run's headline
the formula of the paper its algorithm comes from, so that it can be set beside that
paper's table; every ``energy.json`` holds each of them in ``paper_conventions``. Each
counts arithmetic only (E_MAC, E_AC of the profile; no neuron updates or spikes).

- **FedSNN** (Venkatesha et al. 2021, Sec. IV-F): over the conv and FC layers (its VGG9
  sums weight layers only; pools left out), OPS = M²·I·k²·O (conv) or I·O (FC);
  E_ANN = Σ OPS·E_MAC, E_SNN = Σ OPS·R·T·E_AC with R the layer's spike activity (its
  input spikes per neuron and step).
- **SFedCA** (Zhan et al. 2024, Eq. 13): SOPs = R·T·FLOPs with FLOPs = Σ MACs over the
  conv and FC layers and R one network-wide rate, the mean over those layers of their
  output firing rates (Eq. 11's average); E_SNN = SOPs·E_AC, E_ANN = FLOPs·E_MAC.
- **SFedHIFI** (Tao et al. 2025, Eq. 15–16): E_ANN = Σ_l FLOPs^(l)·E_MAC,
  E_SNN = FLOPs^(1)·E_MAC + Σ_{l≥2} FLOPs^(l)·r̄^(l)·T·E_AC, r̄^(l) "the average firing rate
  per time step of the neurons in the l-th layer" (read literally: layer l's own output
  rate). FLOPs^(l) as the authors evidently counted it (``sfedhifi``, the default): Eq. 15's
  per-neuron count without its factor 2, (f_in + 1)·β for a layer of neurons (conv, FC) and
  f_in·β for a pool (k² taps; their max pools have no neuron), a factorized convolution
  counted as the authors' 1×1 mixing convolution (f_in = input groups × bank size, their
  ``DecomBlock``) and its bank convolution not at all (their ``conv_basis`` builds it inside
  ``forward``, where a module-hook counter never sees it). This reproduces all four ANN
  energies of their Table 3 to the printed digit (34.059 / 69.503 / 108.639 / 151.469 µJ,
  tests/test_paper_numbers.py); the printed Eq. 15, 2(f_in + 1)·β over every layer with the
  fused k×k fan-in (``sfedhifi_eq15``), gives 4.6–5.3× those numbers on the same net.
- FedSNN's printed ANN energy for VGG9 (227.99 µJ, Sec. IV-F) is not reproduced: its formula
  on the authors' VGG9 (the layer sizes of their ``vgg_spiking_bntt.py``, = ``svgg9``) gives
  623.10 µJ (194.7 M MACs at 3.2 pJ); 227.99 µJ would be 71.25 M MACs, which no subset of
  VGG9's layers (nor pooled output sizes) sums to. SFedCA's Table 4 ANN energies are
  reproduced by its formula on ``sfedca_mnist`` / ``sfedca_alexnet``, whose sizes were chosen
  for that (:mod:`neurofed.models.paper_nets`).

The paper per algorithm (``paper`` convention): sfedca → SFedCA; sfedhifi and
hetero_* → SFedHIFI; every other algorithm → FedSNN (FedLEC reports no energy).
"""

from __future__ import annotations

import math

CONVENTIONS = ("exact", "paper")
PAPERS = ("fedsnn", "sfedca", "sfedhifi", "sfedhifi_eq15")  # paper_conventions' entries
WEIGHT_KINDS = ("conv", "dense")  # FedSNN / SFedCA count these; pools are left out
PJ = 1e-12


def paper_for(algorithm: str) -> str:
    if algorithm == "sfedca":
        return "sfedca"
    if algorithm == "sfedhifi" or algorithm.startswith("hetero_"):
        return "sfedhifi"
    return "fedsnn"


def fan_in(row: dict) -> int:
    """f_in: incoming connections of one neuron of the layer (SFedHIFI Eq. 15)."""
    if row["kind"] == "dense":
        return int(row["in_shape"][0])
    return int(row["macs"] // max(math.prod(row["out_shape"]), 1))  # conv: M²·C_in·k²·O / (O·M²); pool: k²


def sfedhifi_flops(row: dict) -> int:
    """FLOPs^(l) = 2(f_in + 1)·β, Eq. 15 as printed (``sfedhifi_eq15``)."""
    return 2 * (fan_in(row) + 1) * math.prod(row["out_shape"])


def mixing_fan_in(row: dict) -> int:
    """The fan-in of the SFedHIFI authors' 1×1 mixing convolution for a factorized layer:
    C_in // round(group_fraction · C_in at width 1) input groups, each giving
    round(bank_fraction · C_out at width 1) bank responses (their ``DecomBlock``)."""
    f = row["factorized"]
    group_size = max(1, round(f["group_fraction"] * f["full_in"]))
    return int(row["in_shape"][0]) // group_size * max(1, round(f["bank_fraction"] * f["full_out"]))


def sfedhifi_code_flops(row: dict) -> int:
    """FLOPs^(l) as the SFedHIFI authors counted (module doc): (f_in + 1)·β with a neuron,
    f_in·β for a pool, a factorized layer as its 1×1 mixing convolution."""
    f_in = mixing_fan_in(row) if row.get("factorized") else fan_in(row)
    return (f_in + (row["kind"] != "pool")) * math.prod(row["out_shape"])


def paper_ops(rows: list[dict], paper: str, timesteps: int) -> dict:
    """Per inference: ``mac`` (ops priced at E_MAC on the SNN side), ``ac`` (at E_AC) and
    ``ann`` (the ANN's ops at E_MAC) under ``paper``'s formula; None where a rate is unknown."""
    t = timesteps
    if paper == "fedsnn":
        layers = [r for r in rows if r["kind"] in WEIGHT_KINDS]
        mac = sum(r["macs"] for r in layers if r["input"] == "analog")  # direct input: MACs, once
        spiking = [r for r in layers if r["input"] != "analog"]
        if any(r["input_rate"] is None for r in spiking):
            return {"mac": None, "ac": None, "ann": sum(r["macs"] for r in layers)}
        return {"mac": mac, "ac": sum(r["macs"] * r["input_rate"] * t for r in spiking),
                "ann": sum(r["macs"] for r in layers)}
    if paper == "sfedca":
        layers = [r for r in rows if r["kind"] in WEIGHT_KINDS]
        flops = sum(r["macs"] for r in layers)
        if any(r["firing_rate"] is None for r in layers):
            return {"mac": None, "ac": None, "ann": flops}
        rate = sum(r["firing_rate"] for r in layers) / len(layers)
        return {"mac": 0, "ac": rate * t * flops, "ann": flops, "rate": rate}
    if paper in ("sfedhifi", "sfedhifi_eq15"):
        flops = [(sfedhifi_code_flops if paper == "sfedhifi" else sfedhifi_flops)(r) for r in rows]
        if any(r["firing_rate"] is None for r in rows[1:]):
            return {"mac": None, "ac": None, "ann": sum(flops)}
        return {"mac": flops[0], "ac": sum(f * r["firing_rate"] * t for f, r in zip(flops[1:], rows[1:])),
                "ann": sum(flops)}
    raise ValueError(f"energy: unknown paper convention {paper!r}; known: {', '.join(PAPERS)}")


def paper_energy(rows: list[dict], profile, paper: str, timesteps: int) -> dict:
    """``paper``'s energies per inference (J) on ``profile``."""
    ops = paper_ops(rows, paper, timesteps)
    ann = ops["ann"] * profile.mac_pj * PJ
    syn = profile.synaptic_pj
    snn = None
    if ops["ac"] is not None and syn is not None and profile.priced:
        snn = (ops["mac"] * profile.mac_pj + ops["ac"] * syn) * PJ
    return {"snn_energy_j": snn, "ann_energy_j": ann, "ann_over_snn": ann / snn if snn else None,
            "snn_ops": {"mac": ops["mac"], "ac": ops["ac"]}, "ann_ops": ops["ann"],
            **({"network_rate": ops["rate"]} if "rate" in ops else {})}
