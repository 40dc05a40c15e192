"""The energy results as text: the lines ``neurofed energy`` and a run's log print."""

from __future__ import annotations

from neurofed.energy.conventions import PAPERS
from neurofed.seeds import describe_measured, same_measurement


def format_config_numbers(numbers: dict) -> str:
    """One line per width and profile: the ANN energy (µJ) under each count."""
    counts = ("exact",) + PAPERS
    lines = [f"{numbers['model']} on {numbers['dataset']} {'x'.join(map(str, numbers['input_shape']))}, "
             f"ANN twin, no training (SNN energies need a run's spikes); energy per inference in uJ",
             f"{'width':>6s} {'profile':12s} {'MACs (exact)':>13s} " + " ".join(f"{c:>13s}" for c in counts)]
    for width, w in numbers["widths"].items():
        for name, e in w["profiles"].items():
            lines.append(f"{width:>6g} {name:12s} {w['macs']:>13,} " + " ".join(f"{e[c] * 1e6:>13.3f}" for c in counts))
    return "\n".join(lines)


def format_summary(result: dict) -> str:
    """A few lines for the terminal: totals and ratio per profile."""
    lines = []
    spikes = result.get("spikes", {})
    if spikes:
        on = result.get("accuracy_measured_on")
        acc = f"accuracy {percent(result.get('accuracy'))}" + (f" on the same samples ({describe_measured(on)})"
                                                            if on else f" on {spikes['samples']} samples")
        run = result.get("run", {})
        final_on = run.get("final_accuracy_measured_on")
        if run.get("final_accuracy") is not None and not same_measurement(on, final_on):
            acc += (f"; the run's final accuracy {percent(run['final_accuracy'])} (summary.json) is on "
                    + (describe_measured(final_on) if final_on else "its whole test set"))
        lines.append(f"spikes: {spikes['source']} ({spikes['spread']}), {spikes['samples']} samples, "
                     f"T={spikes['timesteps']}; {acc}")
    convention = result.get("convention", "exact")
    if result.get("spikes"):
        lines.append(_CONVENTION_LINES["paper"].format(paper=result.get("paper", "?")) if convention == "paper"
                     else _CONVENTION_LINES["exact"])
    for name, p in result["profiles"].items():
        snn, ann = p.get("snn_energy_j"), p["ann_energy_j"]
        ratio = p.get("ann_over_snn")
        line = f"{name:12s} SNN {microjoules(snn):>12s}  ANN {microjoules(ann):>12s}  ANN/SNN {'-' if ratio is None else f'{ratio:.2f}x'}"
        if snn is None and result.get("spikes"):
            line += f"  (SNN not priced: {_unpriced_reason(name, p)})"
        if p.get("ann_over_snn_approx"):
            line += f"  (with the papers' MACs x rate x T for synaptic ops: {p['ann_over_snn_approx']:.2f}x)"
        why = _why_snn_costs_more(p) if ratio is not None and ratio < 1 else None
        if why:
            line += f"  ({why})"
        lines.append(line)
    return "\n".join(lines)


_CONVENTION_LINES = {
    "exact": "energies: convention exact (measured synaptic ops, pools included; energy.json paper_conventions "
             "has the papers' formulas)",
    "paper": "energies: convention paper ({paper}'s formula, neurofed.energy.conventions; the measured count "
             "is under 'exact' in energy.json)",
}


def _unpriced_reason(name: str, p: dict) -> str:
    """Why a profile prices no SNN energy (its ``note``, or the profile's own flags)."""
    prof = p.get("profile") or {}
    if prof.get("measured_only"):
        return f"{name} publishes no per-operation energies; measure power on the chip (hw_profiles/{name}.yaml)"
    return p.get("note") or f"{name} lacks an energy per synaptic op"


def _why_snn_costs_more(p: dict) -> str | None:
    """One clause for ANN/SNN < 1: which priced part dominates the SNN, and what the ANN is priced on."""
    parts = p.get("snn_breakdown_j") or {}
    snn = p.get("snn_energy_j")
    if not parts or not snn:
        return None
    part, joules = max(parts.items(), key=lambda kv: kv[1])
    what = {"neuron_updates": "neuron updates (every neuron, every time step)", "synaptic_ops": "synaptic ops",
            "analog_macs": "the analog first layer's MACs", "spikes": "spike routing"}.get(part, part)
    prof = p.get("profile") or {}
    ann_on = f"; the ANN is priced on {prof['ann_baseline']}'s MAC" if prof.get("ann_baseline") else ""
    return f"the SNN costs {1 / p['ann_over_snn']:.1f}x the ANN: {what} are {100 * joules / snn:.0f}% of it{ann_on}"


def microjoules(j):
    return "-" if j is None else f"{j * 1e6:.4g} uJ"


def percent(a):
    return "-" if a is None else f"{100 * a:.1f}%"
