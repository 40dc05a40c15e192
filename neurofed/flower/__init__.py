"""neurofed as a Flower app: the same algorithms on many machines.

``neurofed.flower.app:server_app`` runs the experiment (server half of the
algorithm, centralized evaluation, the run directory of ``neurofed run``);
``neurofed.flower.app:client_app`` trains a partition on each SuperNode (client
half). Parameters travel as ``ArrayRecord``, client configs as ``ConfigRecord``,
metrics as ``MetricRecord`` (:mod:`neurofed.flower.records`); the strategy is
:class:`neurofed.flower.strategy.AlgorithmStrategy`.

Importing this package keeps Flower and Ray from calling home (telemetry, update
checks, usage statistics) unless the environment already says otherwise; the
command-line tools (``flwr``, ``flower-superlink``, ``flower-supernode``) read the
same variables from the shell (docs/flower.md).
"""

import os

# Read by flwr and ray at import time, so set before either is imported.
for _var, _value in (("FLWR_TELEMETRY_ENABLED", "0"), ("FLWR_DISABLE_UPDATE_CHECK", "1"),
                     ("RAY_USAGE_STATS_ENABLED", "0")):
    os.environ.setdefault(_var, _value)
