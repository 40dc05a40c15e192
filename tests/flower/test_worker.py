"""neurofed.flower.worker: the long-lived ClientApp worker."""

from __future__ import annotations

import threading

import pytest

import flower_helpers  # noqa: F401  (first: telemetry off before flwr is imported)


def test_worker_drops_a_message_its_supernode_gave_up_and_serves_the_next_task(monkeypatch):
    """A task whose message objects never come (its SuperNode gave the message up when
    the run ended mid-transfer) ends as soon as the SuperNode queues another task; that
    task is claimed once, by one of the pull threads, and runs next."""
    from flwr.proto.message_pb2 import PullObjectResponse
    from flwr.proto.node_pb2 import Node as NodeProto
    from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
    from flwr.supercore.inflatable.inflatable_utils import pull_objects
    from flwr.supercore.runtime import RuntimeHttpClient

    from neurofed.flower.worker import MessageDropped, Worker

    monkeypatch.setattr(RuntimeHttpClient, "PullObject",
                        lambda self, request: PullObjectResponse(object_found=True, object_available=False))
    worker = Worker("127.0.0.1:9", insecure=True)  # no connection is made
    queued, claims = iter([None, None, None, "next-task"]), []  # a task is queued after three asks

    def acquire():
        claims.append(next(queued, None))
        return claims[-1]

    monkeypatch.setattr(worker, "acquire", acquire)
    client = worker._client("dead-run-task")
    pull = make_pull_object_fn_protobuf(client.PullObject, NodeProto(node_id=1), run_id=7)
    with pytest.raises(MessageDropped, match="run 7"):
        pull_objects(["arrays", "config", "message"], pull, initial_backoff=0.01, backoff_cap=0.01)
    assert claims.count("next-task") == 1 and worker.claimed == "next-task"

    ran, stop = [], threading.Event()

    def run_task(token):
        ran.append(token)
        stop.set()

    monkeypatch.setattr(worker, "run_task", run_task)
    worker.serve(stop)
    assert ran == ["next-task"] and worker.claimed is None



def test_worker_runs_only_fabs_that_ship_its_own_code(tmp_path):
    """The long-lived worker runs a run's tasks only if the FAB's neurofed sources,
    example configs and hardware profiles equal its own; it names the first that differs."""
    import io
    import zipfile

    from neurofed.flower.worker import differing_file

    root = tmp_path / "app"
    (root / "neurofed").mkdir(parents=True)
    (root / "neurofed" / "a.py").write_text("x = 1\n")
    (root / "examples").mkdir()
    (root / "examples" / "c.yaml").write_text("seed: 0\n")

    def fab(**files) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, text in files.items():
                z.writestr(name.replace("__", "/"), text)
        return buf.getvalue()

    same = {"neurofed__a.py": "x = 1\n", "examples__c.yaml": "seed: 0\n", "pyproject.toml": "[any]\n"}
    assert differing_file(fab(**same), root) is None  # pyproject.toml (rewritten by flwr) is not compared
    assert differing_file(fab(**{**same, "neurofed__a.py": "x = 2\n"}), root) == "neurofed/a.py"
    assert differing_file(fab(**{**same, "hw_profiles__new.yaml": "pj: 1\n"}), root) == "hw_profiles/new.yaml"
