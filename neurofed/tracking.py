"""Experiment tracking: TensorBoard event files beside ``metrics.jsonl``.

On with the config key ``log.tensorboard: true``; ``tensorboard --logdir runs/`` then
shows every run. Written with torch's ``SummaryWriter`` into ``RUN_DIR/tensorboard/``,
round by round (the round is the step), tags:

- ``test/accuracy``, ``test/loss``, ``test/firing_rate``, ``test/firing_rate_layer/<i>``
  (the global model on the test set, as metrics.jsonl), ``train/loss`` (clients' mean);
- ``comm/bytes_up``, ``comm/bytes_down``, ``time/round_s``;
- after the energy step (``energy.enabled``): ``energy/train_snn_j`` and
  ``energy/train_ann_j`` (client training energy of each round, energy.json's
  ``training``) and, at the last round, ``energy/inference_snn_j/<profile>`` and
  ``energy/inference_ann_j/<profile>`` (per inference).

A resumed run appends a new event file; TensorBoard merges them by step.
"""

from __future__ import annotations

import json
from pathlib import Path

from neurofed.config import Section, boolean, register_section

TB_DIR = "tensorboard"

register_section(Section("log", {"tensorboard": False}, lambda: {"log.tensorboard": boolean}))


class TensorBoardLog:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / TB_DIR))

    @classmethod
    def for_run(cls, cfg: dict, run_dir: Path) -> TensorBoardLog | None:
        return cls(run_dir) if cfg.get("log", {}).get("tensorboard") else None

    def round(self, record: dict) -> None:
        step = record["round"]
        scalars = {"test/accuracy": record.get("accuracy"), "test/loss": record.get("loss"),
                   "test/firing_rate": record.get("firing_rate"), "train/loss": record.get("train_loss"),
                   "comm/bytes_up": record.get("bytes_up"), "comm/bytes_down": record.get("bytes_down"),
                   "time/round_s": record.get("wall_time_s")}
        for i, rate in enumerate(record.get("layer_firing_rates") or []):
            scalars[f"test/firing_rate_layer/{i}"] = rate
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def energy(self, run_dir: Path, last_round: int) -> None:
        """The energy step's results (energy.json), when it wrote them."""
        path = Path(run_dir) / "energy.json"
        if not path.is_file():
            return
        energy = json.loads(path.read_text())
        training = energy.get("training") or {}
        for key, tag in (("snn_cumulative_j", "energy/train_snn_j"), ("ann_cumulative_j", "energy/train_ann_j")):
            cumulative = training.get(key)
            if cumulative:  # per round = the difference of the cumulative sums
                for rnd, now, before in zip(training["rounds"], cumulative, [0.0] + cumulative[:-1]):
                    self.writer.add_scalar(tag, now - before, rnd)
        for name, p in (energy.get("profiles") or {}).items():
            for key, tag in (("snn_energy_j", "energy/inference_snn_j"), ("ann_energy_j", "energy/inference_ann_j")):
                if p.get(key) is not None:
                    self.writer.add_scalar(f"{tag}/{name}", p[key], last_round)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
