"""Energy: op counts per layer from measured spikes, hardware profiles, reports.

- :mod:`~neurofed.models.opcounts`: MACs, synaptic ops (exact and the papers' approximation),
  membrane updates per layer; NeuroBench names.
- :mod:`~neurofed.energy.spikes`: spike counts from a torch pass or Lava's lava.json.
- :mod:`~neurofed.energy.profiles`: ``hw_profiles/*.yaml`` (pJ per op, with sources).
- :mod:`~neurofed.energy.report`: energy.json, per-layer plot, multi-run report.
- :mod:`~neurofed.energy.training`: training energy over rounds / to a target accuracy.
"""

from neurofed.energy.profiles import Profile, ProfileError, load_profile, load_profiles, profile_names
from neurofed.energy.report import DEFAULT_PROFILES, energy_for_run, load_run
from neurofed.energy.table import energy_report
from neurofed.energy.training import plot_training_energy, training_energy

__all__ = ["Profile", "ProfileError", "load_profile", "load_profiles", "profile_names", "DEFAULT_PROFILES",
           "energy_for_run", "energy_report", "load_run", "training_energy", "plot_training_energy"]
