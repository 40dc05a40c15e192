"""Hardware energy profiles: ``hw_profiles/<name>.yaml``, loaded by name or path.

A profile prices operations in pJ; every number carries its unit and its source.
The schema (other sections, such as the Lava engineer's ``limits:``, are allowed and
ignored here)::

    name: cmos45_int            # str
    title: ...                  # str
    kind: digital | neuromorphic
    energy:                     # priced operations, each {value, unit: pJ, source}
      mac, ac                   # digital: both required
      synaptic_op, neuron_update, spike   # neuromorphic (synaptic_op required
                                          # unless measured_only: true)
    ann_baseline: cmos45_int    # neuromorphic: the digital profile whose MAC prices
                                # the ANN twin and an analog first layer
    measured_only: false        # true: no published per-op figures (Loihi 2)
    reference: {...}            # figures listed for information, never priced

Errors are one line each, naming the file, the key, the value and what is allowed.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from neurofed.config import ConfigError, Section, boolean, choice, register_section
from neurofed.resources import profiles_dir

PROFILE_DIR = profiles_dir()  # the shipped profiles (neurofed.resources)
KINDS = ("digital", "neuromorphic")
# Operation name -> what it prices (used in error messages and reports).
OPS = {
    "mac": "one multiply-accumulate (ANN twin; analog input to the first SNN layer)",
    "ac": "one accumulate (an SNN synaptic operation on a digital accelerator)",
    "synaptic_op": "one synaptic event on neuromorphic hardware",
    "neuron_update": "one neuron (compartment) state update per time step",
    "spike": "one emitted spike (routing)",
}
REQUIRED = {"digital": ("mac", "ac"), "neuromorphic": ("synaptic_op",)}
UNITS = ("pJ",)


class ProfileError(ConfigError):
    """An unusable hardware profile; one line per problem."""


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    kind: str
    energy_pj: dict[str, float]  # priced ops only
    sources: dict[str, str]
    path: str
    ann_baseline: "Profile | None" = None
    measured_only: bool = False
    reference: dict = field(default_factory=dict)
    notes: str = ""

    @property
    def priced(self) -> bool:
        """False when the profile has no per-op figures (e.g. Loihi 2)."""
        return bool(self.energy_pj)

    def pj(self, op: str) -> float | None:
        return self.energy_pj.get(op)

    @property
    def synaptic_pj(self) -> float | None:
        """What one spike-driven synaptic operation costs here."""
        return self.energy_pj.get("synaptic_op", self.energy_pj.get("ac"))

    @property
    def mac_pj(self) -> float:
        """What one MAC costs here, or on the ANN baseline for neuromorphic targets."""
        if "mac" in self.energy_pj:
            return self.energy_pj["mac"]
        return self.ann_baseline.mac_pj

    def summary(self) -> dict:
        """What a report records about the profile (numbers with their sources)."""
        return {
            "name": self.name,
            "title": self.title,
            "kind": self.kind,
            "path": self.path,
            "energy_pj": dict(self.energy_pj),
            "sources": dict(self.sources),
            "ann_baseline": self.ann_baseline.name if self.ann_baseline else None,
            "mac_pj_for_ann": self.mac_pj,
            "measured_only": self.measured_only,
            "unpriced": sorted(self.reference),
            "notes": self.notes,
        }


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _resolve_path(ref: str | Path) -> Path:
    ref = str(ref)
    looks_like_path = ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref
    if looks_like_path:
        path = Path(ref)
        if not path.is_file():
            raise ProfileError(f"hw profile {ref!r}: file not found")
        return path
    path = PROFILE_DIR / f"{ref}.yaml"
    if not path.is_file():
        raise ProfileError(f"hw profile {ref!r}: unknown name; known: {', '.join(profile_names())} "
                           f"(or pass a path to a .yaml file)")
    return path


def _check_entry(where: str, key: str, entry) -> tuple[float | None, list[str]]:
    problems = []
    if not isinstance(entry, dict):
        return None, [f"{where}: {key}: got {entry!r}; expected a mapping with value, unit, source"]
    value = entry.get("value")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        problems.append(f"{where}: {key}.value: got {value!r}; expected a number >= 0 (pJ)")
    unit = entry.get("unit")
    if unit not in UNITS:
        problems.append(f"{where}: {key}.unit: got {unit!r}; allowed: {', '.join(UNITS)}")
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        problems.append(f"{where}: {key}.source: missing; every number needs its source (paper, table)")
    return (float(value) if not problems else None), problems


def parse_profile(data, where: str, resolve_baseline=None) -> Profile:
    """Validate a profile mapping; raise ProfileError listing every problem."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping at top level (name, title, kind, energy)")
    problems: list[str] = []
    for key in ("name", "title"):
        if not isinstance(data.get(key), str) or not data.get(key).strip():
            problems.append(f"{where}: {key}: got {data.get(key)!r}; expected a non-empty string")
    kind = data.get("kind")
    if kind not in KINDS:
        problems.append(f"{where}: kind: got {kind!r}; allowed: {', '.join(KINDS)}")
    measured_only = data.get("measured_only", False)
    if not isinstance(measured_only, bool):
        problems.append(f"{where}: measured_only: got {measured_only!r}; expected true or false")
    energy = data.get("energy")
    prices: dict[str, float] = {}
    sources: dict[str, str] = {}
    if not isinstance(energy, dict):
        problems.append(f"{where}: energy: got {energy!r}; expected a mapping of operation -> "
                        f"{{value, unit, source}} (operations: {', '.join(OPS)})")
        energy = {}
    for op, entry in energy.items():
        if op not in OPS:
            problems.append(f"{where}: energy.{op}: unknown operation; allowed: {', '.join(OPS)} "
                            f"(put other figures under reference:)")
            continue
        value, errs = _check_entry(where, f"energy.{op}", entry)
        problems += errs
        if value is not None:
            prices[op] = value
            sources[op] = entry["source"].strip()
    reference = data.get("reference") or {}
    if not isinstance(reference, dict):
        problems.append(f"{where}: reference: got {reference!r}; expected a mapping")
        reference = {}
    for key, entry in reference.items():
        problems += _check_entry(where, f"reference.{key}", entry)[1]
    if kind in KINDS and not (kind == "neuromorphic" and measured_only):
        for op in REQUIRED[kind]:
            if op not in energy:
                hint = " (or set measured_only: true when no per-op figures are published)" \
                    if kind == "neuromorphic" else ""
                problems.append(f"{where}: energy.{op}: missing; a {kind} profile needs "
                                f"{', '.join(REQUIRED[kind])}{hint}")
    baseline = None
    if kind == "neuromorphic":
        ref = data.get("ann_baseline")
        if not isinstance(ref, str):
            problems.append(f"{where}: ann_baseline: got {ref!r}; expected the name or path of a digital "
                            f"profile that prices the ANN twin (e.g. cmos45_int)")
        elif not problems:
            baseline = (resolve_baseline or load_profile)(ref)
            if baseline.kind != "digital":
                problems.append(f"{where}: ann_baseline: {ref!r} is {baseline.kind}; expected a digital profile")
    if problems:
        raise ProfileError("\n".join(problems))
    return Profile(
        name=data["name"].strip(), title=data["title"].strip(), kind=kind, energy_pj=prices,
        sources=sources, path=where, ann_baseline=baseline, measured_only=measured_only,
        reference=dict(reference), notes=str(data.get("notes", "")).strip(),
    )


def load_profile(ref: str | Path) -> Profile:
    """Load a profile by bundled name (``cmos45_int``) or by path to a YAML file."""
    if isinstance(ref, Profile):
        return ref
    path = _resolve_path(ref)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"hw profile {str(path)!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_profile(data, str(path))


def load_profiles(refs) -> list[Profile]:
    refs = [refs] if isinstance(refs, (str, Path, Profile)) else list(refs)
    if not refs:
        raise ProfileError("energy profiles: got an empty list; name at least one, e.g. cmos45_int")
    return [load_profile(r) for r in refs]


def check_profile_refs(refs) -> str | None:
    """Config check for ``energy.profiles``: a non-empty list of loadable profiles."""
    if not isinstance(refs, (list, tuple)) or not refs or not all(isinstance(r, str) for r in refs):
        return f"expected a non-empty list of profile names or paths; known: {', '.join(profile_names())}"
    try:
        load_profiles(refs)
    except ProfileError as exc:
        return str(exc).splitlines()[0]
    return None


# After training (and export/Lava): energy.json per hw profile; the first is the headline.
ENERGY_DEFAULTS: dict = {
    "enabled": True,
    "profiles": ["cmos45_int", "cmos45_fp32", "loihi", "truenorth", "loihi2"],
    "spikes": "torch",  # torch: exact per-position counts on the test set; lava: lava.json
    # exact: measured synaptic ops | paper: the headline by the algorithm's paper's formula
    # (FedSNN Sec. IV-F, SFedCA Eq. 13, SFedHIFI Eq. 15-16; neurofed.energy.conventions)
    "convention": "exact",
}


register_section(Section("energy", ENERGY_DEFAULTS, lambda: {
    "energy.enabled": boolean,
    "energy.profiles": check_profile_refs,
    "energy.spikes": choice(("auto", "torch", "lava")),
    "energy.convention": choice(("exact", "paper")),
}))
