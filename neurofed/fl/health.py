"""Is the run learning? Silent layers, stuck losses and dropped updates, caught and said.

A spiking network that does not fire trains to nothing and still "finishes": a silent
output layer gives equal logits, so the loss sits at ln(K) and accuracy at chance in
every round. :class:`Health` watches for that and says so, once each:

- **at the start**, every spiking layer's firing rate on one batch of training samples
  (the same batch ``model.init: firing`` calibrates on); a layer below
  :data:`SILENT_RATE` is named in one line with the word ``silent``;
- **each round**: an output layer that never fired on the test set (spike readout), a
  test loss within :data:`CHANCE_TOLERANCE` of ln(K) for :data:`STUCK_ROUNDS` rounds in a
  row, client updates dropped as non-finite, a round in which no update was aggregated.

Everything found goes to ``summary.json`` under ``health`` (``ok`` is false when any
problem was seen), and ``neurofed run --strict`` exits 1 on it.
"""

from __future__ import annotations

import logging
import math

import torch

SILENT_RATE = 1e-4  # spikes per neuron per step below which a layer counts as silent
CHANCE_TOLERANCE = 1e-3  # |loss - ln K| below this: the logits carry no information
STUCK_ROUNDS = 3  # rounds in a row at chance loss before it is reported

log = logging.getLogger(__name__)


def _warn(msg: str) -> None:
    log.warning("warning: %s", msg)  # the console shows it (neurofed.logs), run.log keeps it


def layer_names(model) -> list[str]:
    """``"<index> (<kind>)"`` for each layer with neurons, in the order firing rates are listed."""
    return [f"{i} ({layer.kind})" for i, layer in enumerate(model.layers) if layer.has_neurons]


def start_rates(model, cfg: dict, x_train: torch.Tensor) -> list[float]:
    """Each spiking layer's firing rate (spikes / neuron / step) on the samples the
    calibration uses (:func:`neurofed.models.init.calibration_indices`)."""
    from neurofed.seeds import seed_for
    from neurofed.training.local import forward_dataset, layer_firing_rates
    from neurofed.models.init import calibration_indices

    idx, _ = calibration_indices(cfg, len(x_train))
    _, spikes = forward_dataset(model, x_train[idx], cfg["data"], seed_for(cfg["seed"], "init_batch"),
                                batch_statistics=True)  # as the first training step runs a normed layer
    return layer_firing_rates(model, spikes, cfg["data"]["timesteps"]).tolist()


class Health:
    """The health record of one run (see the module docstring)."""

    def __init__(self, cfg: dict, num_classes: int):
        self.cfg = cfg
        self.chance_loss = math.log(num_classes)
        self.problems: list[str] = []
        self.record: dict = {"silent_at_start": [], "output_silent_rounds": [], "chance_loss_rounds": [],
                             "nonfinite_updates": 0, "rounds_without_update": []}
        self._stuck = 0
        self._said: set[str] = set()
        self._quiet = False  # replaying a resumed run's rounds: recorded, said already

    def _problem(self, key: str, msg: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.problems.append(msg)
            if not self._quiet:
                _warn(msg)

    def replay(self, history: list[dict], model) -> None:
        """Rebuild the record of a resumed run's earlier rounds (said when first seen)."""
        self._quiet = True
        try:
            for record in history:
                self.check_round(record, model)
        finally:
            self._quiet = False

    def check_start(self, model, x_train: torch.Tensor) -> None:
        if getattr(model, "kind", "snn") != "snn":
            return
        rates = start_rates(model, self.cfg, x_train)
        names = layer_names(model)
        voltage = [model.is_voltage_layer(i) for i, layer in enumerate(model.layers) if layer.has_neurons]
        self.record["start_rates"] = {n: round(r, 6) for n, r in zip(names, rates)}
        silent = [n for n, r, v in zip(names, rates, voltage) if r < SILENT_RATE and not v]
        self.record["silent_at_start"] = silent
        if silent:
            hint = ("" if self.cfg["model"].get("init") == "firing"
                    else "; model.init: firing scales each layer to fire on the data (neurofed.models.init)")
            self._problem("silent_start", f"layers silent at the start (firing rate < {SILENT_RATE:g} on "
                                          f"{self.cfg['model'].get('init_samples', 64)} training samples): "
                                          f"{', '.join(silent)}{hint}")

    def check_round(self, record: dict, model) -> None:
        rnd = record["round"]
        rates = record.get("layer_firing_rates")
        spike_readout = getattr(model, "readout_kind", "spikes") == "spikes" and getattr(model, "kind", "snn") == "snn"
        if spike_readout and rates and rates[-1] == 0:
            self.record["output_silent_rounds"].append(rnd)
            self._problem("output_silent", f"round {rnd}: the output layer fired no spike on the test set "
                                           f"(logits all equal: accuracy is chance)")
        loss = record.get("loss")
        if loss is not None and math.isfinite(loss) and abs(loss - self.chance_loss) < CHANCE_TOLERANCE:
            self.record["chance_loss_rounds"].append(rnd)
            self._stuck += 1
            if self._stuck >= STUCK_ROUNDS:
                self._problem("chance_loss", f"round {rnd}: test loss {loss:.4f} = ln({round(math.exp(self.chance_loss))})"
                                             f" for {self._stuck} rounds in a row: the model is not learning")
        else:
            self._stuck = 0
        nonfinite = sum(1 for f in record.get("failed", []) if "non-finite" in f.get("error", ""))
        if nonfinite:
            self.record["nonfinite_updates"] += nonfinite
            self._problem("nonfinite", f"round {rnd}: {nonfinite} client update(s) dropped as non-finite "
                                       f"(NaN/inf: lower federation.lr?)")
        if not record.get("trained"):
            self.record["rounds_without_update"].append(rnd)
            self._problem("no_update", f"round {rnd}: no client update was aggregated")

    def summary(self) -> dict:
        return {"ok": not self.problems, "problems": list(self.problems), **self.record}
