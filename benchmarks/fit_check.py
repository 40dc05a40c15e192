"""Where a trained network's test accuracy goes: its run's global model scored on the test set
with the norms' kept statistics and with each batch's own, on the training set, and how many
images tie for the top logit (a spike-count readout's counts tie; ``argmax`` takes the lowest
label among the tied), what a fair coin among the tied would score, and what the output
neurons' voltage scores as the tie-break (``model.tie_break: voltage``, whatever the run set).

    python benchmarks/fit_check.py RUN_DIR [--samples 10000] [--round last] [--all-test]

A training-set score not far above the test score says the network fits slowly (more steps or
a larger step would help); a gap between the two statistics says the kept ones are off.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import at_least, machine_header, with_one_line_errors  # noqa: E402


def scores(logits: torch.Tensor, y: torch.Tensor) -> dict:
    """Accuracy, images whose top logit is tied, images wrong with their label among the tied,
    and the accuracy a fair coin among the tied would score on average (each image counts
    1 / (labels tied) when its label is among them), all in %."""
    top = logits.max(1, keepdim=True).values
    at_top = logits == top
    tied = at_top.sum(1) > 1
    right = logits.argmax(1) == y
    label_at_top = at_top.gather(1, y[:, None]).squeeze(1)
    label_tied = tied & label_at_top
    return {"accuracy": 100 * right.float().mean().item(), "tied": 100 * tied.float().mean().item(),
            "wrong_in_tie": 100 * (label_tied & ~right).float().mean().item(),
            "ties_split": 100 * (label_at_top.float() / at_top.sum(1)).mean().item()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--samples", type=at_least(1), default=10000, help="images of each set scored (the first ones)")
    p.add_argument("--round", default="last", help="best, last or a kept round's number")
    p.add_argument("--threads", type=at_least(1), default=1)
    p.add_argument("--all-test", action="store_true",
                   help="score the data set's whole test split, not the run's data.test_subset slice")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from neurofed.data import load_dataset
    from neurofed.deploy.export import load_global_model
    from neurofed.rundir import read_run_config
    from neurofed.training.local import forward_dataset

    dataset = None
    if args.all_test:  # a run evaluated on a slice for speed; the papers' tables use the whole split
        cfg = read_run_config(args.run_dir)
        dataset = load_dataset({**cfg["data"], "test_subset": None}, cfg["seed"])
    run = load_global_model(args.run_dir, dataset=dataset, model_round=args.round)
    ds, n = run.dataset, args.samples
    print(machine_header("fit_check", f"({args.threads} thread(s))"))
    print(f"\n{args.run_dir}, round {run.round}, first {n} images of each set\n")
    print("| set | statistics | accuracy % | tied for the top % | wrong with the label tied % "
          "| accuracy with ties split evenly % | accuracy with ties broken by voltage % |")
    print("|---|---|---|---|---|---|---|")
    # an ANN twin's logits do not tie: one pass; an SNN's are scored under both tie rules
    rules = ("lowest_label", "voltage") if hasattr(run.model, "tie_break") else ("lowest_label",)
    sets = [("test", ds.x_test, ds.y_test, False), ("test", ds.x_test, ds.y_test, True),
            ("train", ds.x_train, ds.y_train, False)]
    for name, x, y, by_batch in sets:
        labels, by_rule = torch.as_tensor(y[:n]).long(), {}
        for tie_break in rules:
            if len(rules) > 1:
                run.model.tie_break = tie_break
            logits, _ = forward_dataset(run.model, torch.as_tensor(x[:n]), run.cfg["data"], run.cfg["seed"],
                                        batch_size=run.cfg["federation"]["batch_size"], record=False,
                                        batch_statistics=by_batch)
            by_rule[tie_break] = scores(logits, labels)
        s, voltage = by_rule["lowest_label"], by_rule["voltage"]["accuracy"] if "voltage" in by_rule else float("nan")
        print(f"| {name} | {'each batch' if by_batch else 'kept'} | {s['accuracy']:.2f} | {s['tied']:.2f} "
              f"| {s['wrong_in_tie']:.2f} | {s['ties_split']:.2f} | {voltage:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))