"""The neurofed ``ServerApp``: ``neurofed run`` with its clients on SuperNodes.

The run is the in-process one (:func:`neurofed.pipeline.run`: config.yaml,
metrics.jsonl, summary.json, checkpoint, plots, export/Lava/energy steps) with one
difference: :class:`FlowerExperiment` trains each round through
:class:`~neurofed.flower.strategy.AlgorithmStrategy` and the Flower grid instead of
in this process. The global model is evaluated here, on the test split.
"""

from __future__ import annotations

from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from neurofed.algorithms import get_algorithm_class
from neurofed.config import ConfigError
from neurofed.fl.experiment import Experiment, RoundTraining
from neurofed.pipeline import run
from neurofed.flower.settings import experiment_config, run_dir, settings
from neurofed.flower.strategy import AlgorithmStrategy, exchange


class FlowerExperiment(Experiment):
    """An :class:`Experiment` whose clients answer over ``grid``: same data split, model,
    server half, straggler rule, evaluation and records; only ``train_round`` differs."""

    # fast_kernels: auto must load them here (evaluation every round), not fall back silently
    kernels_required = True

    def __init__(self, cfg: dict, grid: Grid, round_timeout: float = 3600.0, node_timeout: float = 120.0,
                 poll: float = 0.1):
        super().__init__(cfg)
        self.grid = grid
        self.round_timeout = round_timeout
        self.poll = poll
        self.strategy = AlgorithmStrategy(self.server, self.spec, self.survivors, node_timeout=node_timeout,
                                          poll=poll)

    def train_round(self, rnd: int) -> RoundTraining:
        messages = self.strategy.configure_train(rnd, ArrayRecord(), ConfigRecord(), self.grid)
        replies = exchange(self.grid, messages, self.round_timeout, self.poll) if messages else []
        self.strategy.aggregate_train(rnd, replies)
        return self.strategy.last_round

    def run_round(self, rnd: int) -> dict:
        """The runner's record plus ``time_clients``: each reply's ClientApp step times."""
        record = super().run_round(rnd)
        record["time_clients"] = {str(c): t for c, t in sorted(self.strategy.timing.items())}
        return record


def make_server_app(defaults: dict | None = None) -> ServerApp:
    """A ServerApp whose run config falls back to ``defaults`` (for ``run_simulation``)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        s = settings(context.run_config, defaults)
        cfg = experiment_config(s)
        out = run_dir(s, cfg)
        if s["resume"] and get_algorithm_class(cfg["algorithm"]["name"]).needs_client_state:
            raise ConfigError(f"resume: {cfg['algorithm']['name']} keeps client state (e.g. SCAFFOLD's c_i) in each "
                              f"SuperNode's context of the killed run; a new run starts every client without it, so "
                              f"that state is lost and the result would differ; start a fresh run (another out)")
        log(INFO, "neurofed: %s on %s, %d rounds -> %s", cfg["algorithm"]["name"], cfg["data"]["name"],
            cfg["federation"]["rounds"], out)
        summary = run(cfg, out, resume=bool(s["resume"]),
                      experiment=lambda c: FlowerExperiment(c, grid, float(s["round-timeout"]),
                                                            float(s["node-timeout"]), float(s["reply-poll"])))
        log(INFO, "neurofed: final accuracy %.4f (best %.4f) after %d rounds (server device %s) -> %s",
            summary["final_accuracy"], summary["best_accuracy"], summary["rounds"], summary["device"]["device"], out)

    return app
