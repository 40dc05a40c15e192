"""neurofed.flower.client: the ClientApp trains and evaluates like the in-process client half."""

from __future__ import annotations

import numpy as np

# flower_helpers first: it turns Flower's telemetry off before flwr is imported
from flower_helpers import REPO, YAML, task_identity, tiny_set
from flwr.app import ConfigRecord, Context, Message, RecordDict
from neurofed.algorithms.base import FitContext, FitResult
from neurofed.config import load_config
from neurofed.flower.records import from_arrays, from_metrics, load_state, to_arrays, to_config
from neurofed.flower.strategy import NODE_KEY, NUM_EXAMPLES, TARGET_KEY


def test_client_app_evaluates_the_model_of_the_width_its_message_names(task_identity):
    from neurofed.fl.experiment import Experiment
    from neurofed.flower.app import flower_apps

    neurofed_set = tiny_set(**{"algorithm.name": "hetero_fedavg", "model.name": "hifi_cnn_digits",
                               "model.width": 1.0, "algorithm.widths": "[0.5,1.0]"})
    exp = Experiment(load_config(REPO / YAML, neurofed_set.split()))
    _, client_app = flower_apps(**{"neurofed-config": YAML, "neurofed-set": neurofed_set})
    ctx = Context(run_id=1, node_id=77, node_config={"partition-id": 1, "num-partitions": 4}, state=RecordDict(),
                  run_config={})
    half = exp.server.servers[0.5].message()
    ev = client_app(Message(RecordDict({"arrays": to_arrays(half), "config": to_config({"width": 0.5})}),
                            dst_node_id=77, message_type="evaluate"), ctx)
    assert not ev.has_error(), ev.error
    assert 0 <= ev.content["metrics"]["accuracy"] <= 1 and ev.content["metrics"][NUM_EXAMPLES] == len(exp.parts[1])
    # without the width the node builds the run's model (width 1), which the half-width arrays do not fit
    assert client_app(Message(RecordDict({"arrays": to_arrays(half)}), dst_node_id=77, message_type="evaluate"),
                      ctx).has_error()



def test_client_app_trains_like_the_in_process_client_half(task_identity):
    """SCAFFOLD through the ClientApp (its c_i kept in the node's Context.state) gives
    bit for bit the in-process client half's uploads and state, round after round."""
    from neurofed.fl.experiment import Experiment
    from neurofed.flower.app import flower_apps

    neurofed_set = tiny_set(**{"algorithm.name": "scaffold"})
    exp = Experiment(load_config(REPO / YAML, neurofed_set.split()))
    _, client_app = flower_apps(**{"neurofed-config": YAML, "neurofed-set": neurofed_set})
    cid = 2
    ctx = Context(run_id=1, node_id=77, node_config={"partition-id": cid, "num-partitions": 4},
                  state=RecordDict(), run_config={})
    state = {}
    for rnd in (1, 2):
        config = exp.server.client_config(rnd, cid)
        message = exp.server.message()
        params, n, metrics = exp.client.fit(FitContext(message, config, exp.client_data(cid), state))
        msg = Message(RecordDict({"arrays": to_arrays(message), "config": to_config(config),
                                  TARGET_KEY: ConfigRecord({"partition-id": cid})}),
                      dst_node_id=77, message_type="train")
        out = client_app(msg, ctx)
        assert not out.has_error(), out.error
        got = from_arrays(out.content["arrays"])
        assert all(np.array_equal(got[k], v) for k, v in params.items())
        flower_metrics = from_metrics(out.content["metrics"])
        assert flower_metrics.pop(NUM_EXAMPLES) == n and flower_metrics == metrics
        assert np.array_equal(load_state(ctx.state)["c_i"], state["c_i"])
        exp.server.aggregate(rnd, [FitResult(cid, exp.spec.pack(params), n, metrics)])  # new x and c

    # query: the node's partition; a train message for another partition is refused.
    q = client_app(Message(RecordDict(), dst_node_id=77, message_type="query"), ctx)
    assert dict(q.content[NODE_KEY]) == {"partition-id": cid, "num-partitions": 4}
    wrong = Message(RecordDict({"arrays": to_arrays(exp.server.message()), "config": to_config({}),
                                TARGET_KEY: ConfigRecord({"partition-id": 0})}), dst_node_id=77, message_type="train")
    assert "serves partition 2" in client_app(wrong, ctx).error.reason
    # evaluate: the global model on this node's shard.
    ev = client_app(Message(RecordDict({"arrays": to_arrays(exp.server.message())}), dst_node_id=77,
                            message_type="evaluate"), ctx)
    assert 0 <= ev.content["metrics"]["accuracy"] <= 1 and ev.content["metrics"][NUM_EXAMPLES] == len(exp.parts[cid])
    bare = Context(run_id=1, node_id=78, node_config={}, state=RecordDict(), run_config={})
    assert "--node-config 'partition-id=K num-partitions=N'" in client_app(wrong, bare).error.reason
