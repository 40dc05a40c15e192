"""Pricing operation counts on hardware profiles: the energy of one inference, SNN and
its ANN twin. Per inference, for a profile with per-op energies E (pJ):

    SNN = Σ_layers synaptic_ops·E_syn + analog_macs·E_MAC + membrane_updates·E_neuron
                   + output_spikes·E_spike          (terms the profile does not price are 0)
    ANN = Σ_layers MACs·E_MAC                       (E_MAC of the profile or its ann_baseline)

E_syn is ``synaptic_op`` (neuromorphic) or ``ac`` (digital). ``*_approx`` values
replace the measured synaptic ops by the papers' ``MACs × r × T``.
"""

from __future__ import annotations

from neurofed.energy.conventions import PAPERS, PJ, paper_energy, paper_for
from neurofed.energy.profiles import Profile
from neurofed.energy.spikes import SpikeMaps
from neurofed.models.opcounts import count_layers, neurobench_summary


def price(rows: list[dict], profile: Profile) -> dict:
    """Energy per inference (J) of each layer and in total on one profile."""
    mac = profile.mac_pj
    syn = profile.synaptic_pj
    neuron = profile.pj("neuron_update") or 0.0
    spike = profile.pj("spike") or 0.0
    layers, parts = [], {"synaptic_ops": 0.0, "analog_macs": 0.0, "neuron_updates": 0.0, "spikes": 0.0}
    snn_total = approx_total = 0.0
    known = profile.priced
    for r in rows:
        ann = r["macs"] * mac * PJ
        entry = {"name": r["name"], "ann_j": ann, "snn_j": None, "snn_approx_j": None}
        if known and r["synaptic_ops"] is not None:
            extra = {"analog_macs": r["analog_macs"] * mac * PJ,
                     "neuron_updates": r["membrane_updates"] * neuron * PJ,
                     "spikes": (r["output_spikes"] or 0.0) * spike * PJ}
            syn_j = r["synaptic_ops"] * syn * PJ
            entry["snn_j"] = syn_j + sum(extra.values())
            entry["snn_approx_j"] = r["synaptic_ops_approx"] * syn * PJ + sum(extra.values())
            parts["synaptic_ops"] += syn_j
            for k, v in extra.items():
                parts[k] += v
            snn_total += entry["snn_j"]
            approx_total += entry["snn_approx_j"]
        else:
            known = False
        layers.append(entry)
    ann_total = sum(e["ann_j"] for e in layers)
    result = {
        "snn_energy_j": snn_total if known else None,
        "ann_energy_j": ann_total,
        "ann_over_snn": (ann_total / snn_total) if known and snn_total > 0 else None,
        "snn_energy_approx_j": approx_total if known else None,
        "ann_over_snn_approx": (ann_total / approx_total) if known and approx_total > 0 else None,
        "snn_breakdown_j": parts if known else None,
        "layers": layers,
        "profile": profile.summary(),
    }
    if not profile.priced:
        result["note"] = (f"{profile.name}: no per-operation energy figures; op counts only"
                          + (" (measure power on hardware, see the profile's notes)" if profile.measured_only else ""))
    return result


def compute_energy(layers, maps: SpikeMaps, profiles: list[Profile], masks=None, convention: str = "exact",
                   algorithm: str = "fedavg") -> dict:
    """energy.json's content from a topology, measured spikes and profiles.

    ``convention`` (``energy.convention``): ``exact`` headlines the measured count;
    ``paper`` the formula of ``algorithm``'s paper (:mod:`neurofed.energy.conventions`),
    the exact figures kept under ``exact``. ``paper_conventions`` always holds all three
    papers' figures per profile (and SFedHIFI's Eq. 15 as printed)."""
    rows = count_layers(layers, maps.input_maps, maps.output_spikes, maps.samples, maps.timesteps,
                        masks=masks, analog_input=maps.analog_input, skip_maps=maps.skip_maps)
    priced = {p.name: price(rows, p) for p in profiles}
    for j, r in enumerate(rows):
        r["energy"] = {name: {k: v for k, v in res["layers"][j].items() if k != "name"}
                       for name, res in priced.items()}
    first = profiles[0].name
    head = priced[first]
    notes = list(maps.notes)
    if maps.analog_input:
        notes.append("layer 1 gets analog input (direct encoding): priced as MACs once per inference, as "
                     "SFedHIFI Eq. 16 (the input is constant over T; SLAYER recomputes it every step)")
    notes.append("synaptic_ops count only synapses whose 8-bit quantized weight is nonzero "
                 "(NeuroBench Effective_ACs); synaptic_ops_all_weights keeps zero weights")
    notes.append("the exact count includes pool layers on both sides (FedSNN/SFedCA leave them out: energy.convention paper)")
    if any(r.get("shortcut") for r in rows):
        notes.append("residual joins include their shortcut: a 1x1 conv counted as any conv (all weights), "
                     "an identity as one accumulate per shortcut spike and no MAC")
    papers = {p.name: {paper: paper_energy(rows, p, paper, maps.timesteps) for paper in PAPERS} for p in profiles}
    result = {
        "profile": first,
        "convention": convention,
        "snn_energy_j": head["snn_energy_j"],
        "ann_energy_j": head["ann_energy_j"],
        "ann_over_snn": head["ann_over_snn"],
        "snn_energy_approx_j": head["snn_energy_approx_j"],
        "ann_over_snn_approx": head["ann_over_snn_approx"],
        "layers": rows,
        "profiles": {name: {k: v for k, v in res.items() if k != "layers"} for name, res in priced.items()},
        "neurobench": neurobench_summary(rows, maps.timesteps),
        "spikes": {"source": maps.source, "spread": maps.spread, "samples": maps.samples,
                   "timesteps": maps.timesteps, "analog_input": maps.analog_input},
        "accuracy": maps.accuracy,
        "notes": notes,
        "paper_conventions": papers,
    }
    if convention == "paper":
        paper = paper_for(algorithm)
        result["paper"] = paper
        keys = ("snn_energy_j", "ann_energy_j", "ann_over_snn")
        for name, entry in [(first, result)] + list(result["profiles"].items()):
            entry["exact"] = {k: entry[k] for k in keys}
            entry.update({k: papers[name][paper][k] for k in keys})
        notes.append(f"convention paper: headline energies by {paper}'s formula "
                     f"(neurofed.energy.conventions); the measured count is under 'exact'")
    else:
        notes.append("pool layers are counted on both sides (FedSNN/SFedCA leave them out; "
                     "paper_conventions has their formulas)")
    return result


def ann_only(layers, profiles: list[Profile], convention: str = "exact", algorithm: str = "fedavg") -> dict:
    """An ANN run: only the MACs of its own network; with ``convention`` paper the headline is
    the ANN energy by ``algorithm``'s paper's formula (as its tables print the ANN rows)."""
    rows = count_layers(layers, [None] * len(layers), [None] * len(layers), 1, 1)
    for r in rows:
        for k in ("synaptic_ops", "synaptic_ops_all_weights", "synaptic_ops_approx", "firing_rate",
                  "activation_sparsity", "membrane_updates", "input_spikes", "input_rate", "output_spikes"):
            r[k] = None
    priced = {p.name: price(rows, p) for p in profiles}
    for j, r in enumerate(rows):
        r["energy"] = {name: {k: v for k, v in res["layers"][j].items() if k != "name"}
                       for name, res in priced.items()}
    first = profiles[0].name
    papers = {p.name: {paper: {"ann_energy_j": paper_energy(rows, p, paper, 1)["ann_energy_j"]} for paper in PAPERS}
              for p in profiles}
    headline = {n: (papers[n][paper_for(algorithm)]["ann_energy_j"] if convention == "paper" else r["ann_energy_j"])
                for n, r in priced.items()}
    notes = ["an ANN run (model.kind=ann): MACs of its own network only"]
    if convention == "paper":
        notes.append(f"convention paper: ANN energy by {paper_for(algorithm)}'s formula (neurofed.energy.conventions); "
                     f"the exact count is under each profile's 'exact'")
    return {"profile": first, "convention": convention, "snn_energy_j": None, "ann_energy_j": headline[first],
            "ann_over_snn": None, "layers": rows,
            "profiles": {n: {"ann_energy_j": headline[n], "profile": r["profile"],
                             **({"exact": {"ann_energy_j": r["ann_energy_j"]}} if convention == "paper" else {})}
                         for n, r in priced.items()},
            "paper_conventions": papers, **({"paper": paper_for(algorithm)} if convention == "paper" else {}),
            "notes": notes}
