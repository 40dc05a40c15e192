"""A Flower strategy that is a neurofed server half.

Flower's Message API strategy (``flwr.serverapp.strategy.Strategy``) splits a round
into ``configure_train`` (messages out) and ``aggregate_train`` (replies in). Here
both defer to any neurofed ``Algorithm.Server`` — selection, aggregation and server
state are the algorithm's, exactly as in the in-process runner; Flower only carries
the messages. Every algorithm in :mod:`neurofed.algorithms` runs unchanged, SFedCA's
candidate rounds included (all S candidates train and report ``delta_r``; the server
half aggregates the top P), and so do the heterogeneous-width ones (SFedHIFI, the
``hetero_*`` baselines): each client downloads ``Server.message_for(cid, config)``
(its width's global model) and its reply is read with ``Server.spec_for(config)``,
as in the in-process runner.

neurofed addresses clients by partition id (the shard index of
:func:`neurofed.fl.experiment.load_partitioned`); Flower addresses SuperNodes by node
id. Each SuperNode declares its shard in its node config (``partition-id``,
``num-partitions``; the simulation engine sets both), and the strategy learns the
mapping by sending a ``query`` message to every node it has not heard from yet.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Callable, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from neurofed.algorithms.base import FitResult, screen_update
from neurofed.config import ConfigError
from neurofed.training.params import ParamSpec
from neurofed.fl.experiment import RoundTraining
from neurofed.flower.records import from_arrays, from_metrics, to_arrays, to_config, to_metrics

# Record keys of the messages (beside Flower's conventional "arrays"/"config"/"metrics").
NODE_KEY = "neurofed.node"  # query reply: {"partition-id", "num-partitions"}
TARGET_KEY = "neurofed.target"  # train message: {"partition-id"} that must train
EXTRA_KEY = "metrics-extra"  # reply metrics a MetricRecord cannot hold, as JSON
NUM_EXAMPLES = "num-examples"  # Flower's name for n_k in a reply's MetricRecord
TIMING_KEY = "neurofed.timing"  # reply: seconds per ClientApp step (neurofed.flower.client.Timer)


def exchange(grid: Grid, messages: list[Message], timeout: float, poll: float) -> list[Message]:
    """``grid.send_and_receive`` polling every ``poll`` s: flwr 1.41's deployment grid
    waits 3 s between pulls, which a round pays once more on top of the SuperNodes'."""
    ids = set(grid.push_messages(messages))
    replies: list[Message] = []
    deadline = time.monotonic() + timeout
    while ids:
        got = list(grid.pull_messages(ids))
        replies += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if not ids or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return replies


class AlgorithmStrategy(Strategy):
    """Flower strategy wrapping ``server`` (a neurofed ``Algorithm.Server``).

    ``configure_train``: ``server.configure(round)`` picks the partitions and each
    one's config; FedSNN's straggler rule (``survivors(round, cids)``, the runner's
    :meth:`~neurofed.fl.experiment.Experiment.survivors`) drops some; every remaining
    partition gets a ``train`` message at the SuperNode serving it, holding
    ``"arrays"`` = ``server.message_for(cid, config)`` (global parameters plus server
    state such as SCAFFOLD's c; for servers with one global model per width, e.g.
    SFedHIFI, the model of the client's width), ``"config"`` = its client config, and
    ``"neurofed.target"`` = its partition id. The ``arrays`` and ``config`` arguments
    are ignored: the server half owns the global parameters and the client configs.

    ``aggregate_train``: replies become :class:`FitResult` s in plan order (so the
    float sums equal the in-process runner's), each packed in the layout
    ``server.spec_for(config)`` of its client's config (its width's parameters for a
    heterogeneous-width server); error replies, missing replies,
    partitions no SuperNode serves and non-finite updates are dropped and logged as
    failed; ``server.aggregate`` does the rest. Returns the new global parameters
    and the server half's numeric metrics; the whole round is in ``last_round``.

    Evaluation is centralized (the runner evaluates the global model on the test
    split, as in process), so ``configure_evaluate`` sends nothing.
    """

    def __init__(self, server, spec: ParamSpec,
                 survivors: Callable[[int, list[int]], list[int]] | None = None,
                 node_timeout: float = 120.0, poll: float = 0.1):
        self.server = server
        self.poll = poll
        self.spec = spec
        self.survivors = survivors or (lambda rnd, cids: list(cids))
        self.node_timeout = node_timeout
        self.partitions: dict[int, int] = {}  # partition id -> node id
        self.refused: dict[int, str] = {}  # node id -> why it serves no partition
        self.standby: dict[int, int] = {}  # node id -> the partition it declared, served by another node
        self._queries: dict[str, int] = {}  # query message id -> node id, unanswered yet
        self.last_round: RoundTraining | None = None
        self.timing: dict[int, dict] = {}  # partition id -> the last round's ClientApp step times
        self._pending: tuple | None = None
        self._waited = False  # only the first round waits for SuperNodes to connect

    def summary(self) -> None:
        log(INFO, "\t├──> neurofed server half: %s (%d partitions)", type(self.server).__name__,
            self.server.num_clients)
        log(INFO, "\t└──> evaluation: centralized (the server's test split)")

    # -- which SuperNode serves which partition -----------------------------------------
    def map_nodes(self, grid: Grid, need: Iterable[int] = (), wait: float = 0.0) -> dict[int, int]:
        """Ask the nodes not heard from yet which partition they serve, without waiting
        for them (a reply that comes later is read at the next call); wait up to ``wait``
        s for nodes serving every partition in ``need`` (the SuperNodes of a deployment
        connect over time; only the first round waits).

        Raises ConfigError when every online node is refused (e.g. a simulation with
        num-supernodes != partition.num_clients): no round could train.
        """
        need = set(need)
        deadline = time.monotonic() + wait
        while True:
            online = set(grid.get_node_ids())
            self.partitions = {p: n for p, n in self.partitions.items() if n in online}
            # a node that declared a partition already served (e.g. a SuperNode restarted
            # before the SuperLink declared its old self offline) is asked again once it is free
            for n, p in list(self.standby.items()):
                if n not in online or p not in self.partitions:
                    del self.standby[n]
                    self.refused.pop(n, None)
            self._queries = {m: n for m, n in self._queries.items() if n in online}
            self._read_queries(grid)
            new = sorted(online - set(self.partitions.values()) - set(self.refused) - set(self._queries.values()))
            if new:
                msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in new]
                grid.push_messages(msgs)
                self._queries.update({m.metadata.message_id: n for m, n in zip(msgs, new)})
                self._read_queries(grid)
            if online and not self.partitions and online <= set(self.refused):
                reasons = sorted({self.refused[n] for n in online})
                raise ConfigError(f"no SuperNode serves a partition of this experiment: {'; '.join(reasons)}")
            if need <= set(self.partitions) or time.monotonic() >= deadline:
                return self.partitions
            time.sleep(self.poll)

    def _read_queries(self, grid: Grid) -> None:
        if self._queries:
            replies = list(grid.pull_messages(list(self._queries)))
            for reply in sorted(replies, key=lambda r: r.metadata.src_node_id):  # arrival order varies
                if self._queries.pop(reply.metadata.reply_to_message_id, None) is not None:
                    self.add_node(reply)

    def add_node(self, reply: Message) -> None:
        """Record the partition a node's ``query`` reply declares (or why it is refused)."""
        node = reply.metadata.src_node_id
        if reply.has_error():
            why = reply.error.reason
        else:
            info = reply.content[NODE_KEY]
            pid, n = int(info["partition-id"]), int(info["num-partitions"])
            if n != self.server.num_clients:
                why = (f"node config num-partitions={n}, but partition.num_clients={self.server.num_clients}; "
                       f"start SuperNodes with num-partitions={self.server.num_clients} (simulation: "
                       f"--federation-config 'num-supernodes={self.server.num_clients}')")
            elif not 0 <= pid < n:
                why = f"node config partition-id={pid}; expected 0 <= partition-id < {n}"
            elif self.partitions.get(pid, node) != node:
                why = f"partition-id={pid} is already served by node {self.partitions[pid]}"
                self.standby[node] = pid
            else:
                self.partitions[pid] = node
                return
        self.refused[node] = why
        log(WARNING, "neurofed: node %d serves no partition: %s", node, why)

    # -- training ---------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        plan = self.server.configure(server_round)
        alive = set(self.survivors(server_round, [c for c, _ in plan]))
        self.map_nodes(grid, alive, wait=0.0 if self._waited else self.node_timeout)
        self._waited = True
        messages, sent = [], {}
        for cid, client_config in plan:
            if cid in alive and cid in self.partitions:
                download = to_arrays(self.server.message_for(cid, client_config))
                content = RecordDict({"arrays": download, "config": to_config(client_config),
                                      TARGET_KEY: ConfigRecord({"partition-id": cid})})
                messages.append(Message(content, dst_node_id=self.partitions[cid], message_type=MessageType.TRAIN,
                                        group_id=str(server_round)))
                sent[self.partitions[cid]] = cid
        self._pending = (server_round, plan, alive, sent, time.perf_counter())
        log(INFO, "neurofed round %d: %d of %d selected partitions sent to their SuperNodes", server_round,
            len(messages), len(plan))
        return messages

    def fit_result(self, cid: int, reply: Message, config: dict) -> FitResult:
        """The reply of partition ``cid``, trained with ``config``, as the server half sees it."""
        content = reply.content
        flat = screen_update(self.server.spec_for(config), from_arrays(content["arrays"]))
        metrics = from_metrics(content["metrics"], content[EXTRA_KEY] if EXTRA_KEY in content else None)
        return FitResult(cid, flat, int(metrics.pop(NUM_EXAMPLES)), metrics)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        rnd, plan, alive, sent, t_sent = self._pending
        if rnd != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) after configure_train({rnd})")
        t_agg = time.perf_counter()
        got, errors, configs = {}, {}, dict(plan)
        self.timing = {}
        for reply in replies:
            cid = sent.get(reply.metadata.src_node_id)
            if cid is None:
                continue  # a late reply to an earlier round
            if not reply.has_error() and TIMING_KEY in reply.content:
                self.timing[cid] = dict(reply.content[TIMING_KEY])
            if reply.has_error():
                errors[cid] = reply.error.reason
                continue
            try:
                got[cid] = self.fit_result(cid, reply, configs[cid])
            except Exception as exc:  # a broken reply never reaches the global model
                errors[cid] = f"{type(exc).__name__}: {exc}"
        failed = []
        for cid, _ in plan:
            if cid in alive and cid not in got:
                why = errors.get(cid) or ("no reply within the round timeout" if cid in sent.values()
                                          else "no SuperNode serves this partition")
                failed.append({"client": cid, "error": why})
                log(WARNING, "neurofed round %d: client %d failed: %s", server_round, cid, why)
        results = [got[c] for c, _ in plan if c in got]
        metrics = self.server.aggregate(server_round, results) if results else {"skipped": "no client replied"}
        self.last_round = RoundTraining(plan, [c for c, _ in plan if c not in alive], results, failed, metrics,
                                        t_agg - t_sent, time.perf_counter() - t_agg)
        return to_arrays(self.spec.unpack(self.server.params)), to_metrics(metrics)[0]

    # -- evaluation: centralized, by the runner --------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> list[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Sample-weighted mean of the scalar metrics of ``evaluate`` replies (for
        strategies composed around this one that ask the nodes to evaluate)."""
        replies = [r for r in replies if not r.has_error()]
        if not replies:
            return None
        metrics = [dict(r.content["metrics"]) for r in replies]
        w = np.array([m[NUM_EXAMPLES] for m in metrics], dtype=np.float64)
        keys = [k for k, v in metrics[0].items() if k != NUM_EXAMPLES and not isinstance(v, list)]
        return MetricRecord({k: float(np.dot(w, [m[k] for m in metrics]) / w.sum()) for k in keys})
