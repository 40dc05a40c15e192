"""What a finished run says about itself: summary.json's figures, its plots, and the
notes on settings that do less than their names suggest."""

from __future__ import annotations

import numpy as np

from neurofed.config import ConfigError
from neurofed.fl.resume import note
from neurofed.training.privacy import SEEDED


class RunFailedError(ConfigError):
    """The run finished but did not train: no client's update was ever aggregated."""


def announce(cfg: dict) -> None:
    """One line for each setting that does less than its name may suggest."""
    fed = cfg["federation"]
    noised = fed.get("ldp_laplace") or cfg["algorithm"].get("rate_noise")
    if noised and fed.get("privacy_noise") == SEEDED:
        note("federation.privacy_noise is seeded_not_private: the noise derives from seeds the server holds "
              "and can be removed by it (reproducible, no privacy)")
    if fed.get("ldp_laplace") and fed.get("ldp_clip") is None:
        note("federation.ldp_laplace without federation.ldp_clip is FedLEC Eq. 16: updates are not bounded, "
              "so no epsilon holds (reported as unbounded)")


def summarize(history: list[dict], cfg: dict, wall_time: float) -> dict:
    accs = [h["accuracy"] for h in history]
    target = cfg["federation"].get("target_accuracy")
    reached = next((h["round"] for h in history if target is not None and h["accuracy"] >= target), None)
    best = int(np.argmax(accs)) if accs else None
    return {
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "best_round": history[best]["round"] if best is not None else None,
        "rounds": len(history),
        "rounds_to_target": reached,
        "target_accuracy": target,
        "wall_time_s": round(wall_time, 3),
        "final_firing_rate": history[-1].get("firing_rate") if history else None,
        "bytes_up": int(sum(h["bytes_up"] for h in history)),
        "bytes_down": int(sum(h["bytes_down"] for h in history)),
        "failed_clients": int(sum(len(h["failed"]) for h in history)),
        "final_loss": history[-1]["loss"] if history else None,
        "algorithm": cfg["algorithm"]["name"],
        "model": cfg["model"]["name"],
        "model_kind": cfg["model"].get("kind", "snn"),
        "dataset": cfg["data"]["name"],
        **{k: v for k, v in (history[-1] if history else {}).items() if k.startswith("accuracy_per_")},
    }


def write_plots(out, cfg: dict, history: list[dict], counts) -> None:
    """``plots/accuracy.png`` and the class coverage of the aggregated clients' samples."""
    from neurofed.plots import plot_accuracy, write_class_coverage

    plot_accuracy(history, out / "plots" / "accuracy.png", title=f"{cfg['algorithm']['name']} on {cfg['data']['name']}")
    write_class_coverage(out, history, counts, title=f"{cfg['algorithm']['name']}: class share of aggregated "
                                                     f"clients' samples ({cfg['partition']['scheme']})")
