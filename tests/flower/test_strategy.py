"""neurofed.flower.strategy: the server half's plan sent and hand-built replies aggregated."""

from __future__ import annotations

import numpy as np
import pytest

# flower_helpers first: it turns Flower's telemetry off before flwr is imported
from flower_helpers import HandGrid, reply, task_identity
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord
from neurofed.config import ConfigError
from neurofed.flower.records import from_arrays, from_config
from neurofed.flower.strategy import TARGET_KEY, AlgorithmStrategy


def test_strategy_sends_the_server_half_plan_and_aggregates_hand_built_replies(tiny_cfg, task_identity):
    from neurofed.fl.experiment import Experiment

    cfg = tiny_cfg(**{"federation.clients_per_round": 3})
    exp, twin = Experiment(cfg), Experiment(cfg)
    plan = twin.server.configure(1)  # the same seed: the same selection and configs
    assert len(plan) == 3
    missing = plan[-1][0]  # a selected partition whose SuperNode never connects
    # Node ids unrelated to partition ids.
    node_of = {k: 900 + 3 - k for k in range(4) if k != missing}
    grid = HandGrid({n: {"partition-id": k, "num-partitions": 4} for k, n in node_of.items()})
    strategy = AlgorithmStrategy(exp.server, exp.spec, node_timeout=0.0)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)

    served = plan[:-1]
    assert [int(m.content[TARGET_KEY]["partition-id"]) for m in msgs] == [c for c, _ in served]
    for m, (cid, conf) in zip(msgs, served):
        assert m.metadata.dst_node_id == node_of[cid] and m.metadata.message_type == "train"
        assert from_config(m.content["config"]) == conf
        sent = from_arrays(m.content["arrays"])
        assert all(np.array_equal(sent[k], v) for k, v in twin.server.message().items())

    # Client k uploads the constant vector k+1 with n_k = 10 (k+1); the first reply is an error.
    rs = [reply(m, exp.spec.unpack(np.full(exp.spec.size, cid + 1.0, np.float32)), 10 * (cid + 1),
                train_loss=0.5, label_counts=[cid] * 10)
          for m, (cid, _) in zip(msgs, served)]
    rs[0] = Message(Error(code=2, reason="RuntimeError: device out of memory"), reply_to=msgs[0])
    ok = [cid for cid, _ in served[1:]]
    arrays, metrics = strategy.aggregate_train(1, list(reversed(rs)))

    expected = sum((c + 1.0) * 10 * (c + 1) for c in ok) / sum(10 * (c + 1) for c in ok)
    assert np.allclose(exp.spec.pack(from_arrays(arrays)), expected, rtol=1e-6)
    assert np.array_equal(exp.server.params, exp.spec.pack(from_arrays(arrays)))
    assert isinstance(metrics, MetricRecord)
    tr = strategy.last_round
    assert [r.cid for r in tr.results] == ok  # plan order, whatever the reply order
    assert tr.results[0].metrics == {"train_loss": 0.5, "label_counts": [ok[0]] * 10}
    assert tr.results[0].num_examples == 10 * (ok[0] + 1)
    failed = {f["client"]: f["error"] for f in tr.failed}
    assert failed == {served[0][0]: "RuntimeError: device out of memory",
                      missing: "no SuperNode serves this partition"}



def test_strategy_drops_non_finite_and_missing_replies(tiny_cfg, task_identity):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"partition.num_clients": 3, "federation.clients_per_round": 3}))
    grid = HandGrid({k: {"partition-id": k, "num-partitions": 3} for k in range(3)})
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)
    before = exp.server.params.copy()
    nan = reply(msgs[0], exp.spec.unpack(np.full(exp.spec.size, np.nan, np.float32)), 5)
    good = reply(msgs[1], exp.spec.unpack(np.full(exp.spec.size, 2.0, np.float32)), 5)
    strategy.aggregate_train(1, [nan, good])  # client 2 never replies
    assert np.all(exp.server.params == 2.0) and not np.array_equal(before, exp.server.params)
    errors = {f["client"]: f["error"] for f in strategy.last_round.failed}
    assert errors == {0: "FloatingPointError: update has non-finite values",
                      2: "no reply within the round timeout"}



def test_sfedca_candidates_all_train_and_the_top_p_by_delta_r_are_aggregated(tiny_cfg, task_identity):
    """SFedCA's candidate round under Flower: S candidates get train messages; the
    server half keeps the P replies with the largest ΔR."""
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"algorithm.name": "sfedca", "algorithm.candidates": 3,
                                 "federation.clients_per_round": 2}))
    grid = HandGrid({k: {"partition-id": k, "num-partitions": 4} for k in range(4)})
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)
    cids = [int(m.content[TARGET_KEY]["partition-id"]) for m in msgs]
    assert len(cids) == 3  # all S candidates train, not P
    dr = {c: float(i) for i, c in enumerate(sorted(cids))}  # the two largest ids have the largest ΔR
    rs = [reply(m, exp.spec.unpack(np.full(exp.spec.size, float(c), np.float32)), 7, delta_r=dr[c], steps=1)
          for m, c in zip(msgs, cids)]
    _, metrics = strategy.aggregate_train(1, rs)
    top = sorted(cids)[1:]
    assert list(metrics["aggregated"]) == top
    assert np.allclose(exp.server.params, np.mean(top))  # plain average of the top P (Alg. 1)



def test_heterogeneous_widths_get_their_width_s_model_and_replies_are_read_in_its_layout(tiny_cfg, task_identity):
    """hetero_fedavg under Flower: each partition downloads the global model of the width
    in its config; each reply is unpacked with that width's ParamSpec and averaged only
    within its width."""
    from neurofed.fl.experiment import Experiment

    cfg = tiny_cfg(**{"algorithm.name": "hetero_fedavg", "model.name": "hifi_cnn_digits", "model.width": 1.0,
                      "algorithm.widths": "[0.5,1.0]", "federation.clients_per_round": 3})
    exp = Experiment(cfg)
    grid = HandGrid({k: {"partition-id": k, "num-partitions": 4} for k in range(4)})
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)
    width = {int(m.content[TARGET_KEY]["partition-id"]): from_config(m.content["config"])["width"] for m in msgs}
    assert len(msgs) == 3 and set(width.values()) == {0.5, 1.0}
    for m in msgs:
        cid = int(m.content[TARGET_KEY]["partition-id"])
        sent = from_arrays(m.content["arrays"])
        expected = exp.server.servers[width[cid]].message()
        assert sent.keys() == expected.keys() and all(np.array_equal(sent[k], v) for k, v in expected.items())
    sizes = {p: exp.server.specs[p].size for p in (0.5, 1.0)}
    assert sizes[0.5] < sizes[1.0]
    rs = [reply(m, exp.server.specs[width[c]].unpack(np.full(sizes[width[c]], c + 1.0, np.float32)), 10, width=width[c])
          for m, c in ((m, int(m.content[TARGET_KEY]["partition-id"])) for m in msgs)]
    strategy.aggregate_train(1, rs)
    assert strategy.last_round.failed == []
    for p in (0.5, 1.0):
        mine = [c + 1.0 for c, w in width.items() if w == p]
        np.testing.assert_allclose(exp.server.servers[p].params, np.mean(mine), rtol=1e-6)



def test_nodes_that_serve_no_partition_are_refused_with_the_reason(tiny_cfg, task_identity):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg())  # 4 partitions
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    grid = HandGrid({1: {"partition-id": 0, "num-partitions": 4}, 2: {"partition-id": 0, "num-partitions": 4},
                     3: {"partition-id": 1, "num-partitions": 10}, 4: {}})
    assert strategy.map_nodes(grid) == {0: 1}
    assert "already served by node 1" in strategy.refused[2]
    assert "num-partitions=10, but partition.num_clients=4" in strategy.refused[3]
    assert "lacks partition-id" in strategy.refused[4]
    # Node 1 gone (a SuperNode restarted as node 2 before the SuperLink dropped node 1):
    # node 2 takes partition 0 over; the misconfigured nodes stay refused.
    del grid.node_configs[1]
    assert strategy.map_nodes(grid) == {0: 2} and 2 not in strategy.refused and {3, 4} <= set(strategy.refused)
    # A federation where no node serves this experiment stops at once, saying why.
    with pytest.raises(ConfigError, match="num-supernodes=4"):
        AlgorithmStrategy(exp.server, exp.spec).map_nodes(HandGrid({7: {"partition-id": 0, "num-partitions": 2}}))
