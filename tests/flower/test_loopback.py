"""neurofed.flower.loopback: deployments on this machine (SuperLink + SuperNodes, TLS, killed
and restarted processes) equal the in-process runner."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

# flower_helpers first: it turns Flower's telemetry off before flwr is imported
from flower_helpers import (BIN, HandGrid, KILL_BEFORE_ROUND_3_ARRAYS, REPO, assert_server_ran_fast_kernels, env_for,
                            flwr_run, loopback, processes, read_run, reference, same_records, start_superlink,
                            task_identity, tiny_set)
from neurofed.flower.loopback import free_ports
from flwr.app import Context, RecordDict
from neurofed.config import ConfigError


@pytest.mark.slow
def test_loopback_deployment_superlink_and_two_supernodes(tmp_path, processes):
    """One round on a SuperLink and two SuperNodes (distinct ports, insecure, one
    FLWR_HOME each as on separate machines); the result equals the runner's."""
    neurofed_set = tiny_set(**{"partition.num_clients": 2, "federation.rounds": 1})
    link, node0, node1 = free_ports(3)
    home = start_superlink(tmp_path, processes, link, simulation=False)
    for k, port in enumerate((node0, node1)):
        args = [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{link}", "--port", str(port),
                "--node-config", f"partition-id={k} num-partitions=2", "--max-wait-time", "120"]
        processes.start(args, tmp_path / f"supernode{k}.log", env_for(tmp_path / f"flwr-node{k}"), tmp_path)
    out = tmp_path / "flower"
    t0 = time.monotonic()
    status = flwr_run(home, f"neurofed-set='{neurofed_set}' out='{out}' round-timeout=240.0 node-timeout=120.0")
    assert status == "finished:completed", (tmp_path / "superlink.log").read_text()[-3000:]
    assert time.monotonic() - t0 < 300
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    assert lines[0]["trained"] == [0, 1]



@pytest.mark.slow
def test_tls_deployment_with_long_lived_clientapps_equals_the_runner(tmp_path):
    """Every API over TLS (a CA and server certificate made by the test), each SuperNode
    with ``--isolation process`` and one neurofed worker: 3 rounds equal the runner's bit
    for bit; the SuperLink refuses plain HTTP; each worker built its data and model once
    (set-up parts reported in round 1 only) and started no process per message."""
    import http.client
    import urllib.request

    neurofed_set = tiny_set(**{"partition.num_clients": 2, "federation.rounds": 3})
    out = tmp_path / "flower"
    lb = loopback(tmp_path, 2, tls=True, isolation="process")
    try:
        lb.start()
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{lb.port}/health", timeout=10)
        res = lb.run(f"neurofed-set='{neurofed_set}' out='{out}' round-timeout=300.0 node-timeout=300.0")
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert res["status"] == "finished:completed", res["output"][-3000:]
    assert "--insecure" not in (lb.folder / "superlink.log").read_text()  # no "insecure" warning either
    assert_server_ran_fast_kernels(out)
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    for line in lines:
        times = line["time_clients"]
        assert sorted(times) == ["0", "1"] and all(t["start"] == 0.0 and t["fit"] > 0 for t in times.values())
        assert all(("model" in t) == (line["round"] == 1) for t in times.values()), times



@pytest.mark.slow
def test_a_killed_supernode_fails_its_partition_and_its_restart_brings_it_back(tmp_path):
    """Loopback, 3 SuperNodes (long-lived ClientApps), 3 of 3 partitions per round.
    SuperNode 2 is killed (SIGKILL) after the first round it trained in (round 1 unless
    a worker's first set-up outlasted the round timeout) and restarted once a round has
    recorded partition 2 as failed. Bound: a round whose SuperNode died ends at
    ``round-timeout`` (60 s) at the latest, or earlier when the SuperLink declares the
    node offline (flwr 1.41: 2 missed 30 s heartbeats); with training, evaluation and
    polling every round must end within 60 + 40 s. The other partitions train in every
    round after the kill; partition 2 trains again after the restart."""
    import threading

    rounds, round_timeout = 9, 60.0
    neurofed_set = tiny_set(**{"partition.num_clients": 3, "federation.clients_per_round": 3,
                               "federation.rounds": rounds})
    out = tmp_path / "flower"
    lb = loopback(tmp_path, 3, tls=False, isolation="process")
    events, result = {}, {}

    def lines() -> list[dict]:
        try:
            return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
        except (OSError, json.JSONDecodeError):
            return []

    try:
        lb.start()
        run = threading.Thread(target=lambda: result.update(lb.run(
            f"neurofed-set='{neurofed_set}' out='{out}' round-timeout={round_timeout} node-timeout=300.0",
            timeout=1200)), daemon=True)
        run.start()
        deadline = time.monotonic() + 1200
        while run.is_alive() and time.monotonic() < deadline:
            done = lines()
            if "killed" not in events and done and 2 in done[-1]["trained"]:
                lb.kill_node(2)
                events["killed"] = done[-1]["round"]
            if "restarted" not in events and any(f["client"] == 2 for l in done for f in l["failed"]):
                lb.start_node(2)
                events["restarted"] = done[-1]["round"]
            time.sleep(0.2)
        run.join(timeout=5)
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert result.get("status") == "finished:completed", result.get("output", "")[-3000:]
    done = lines()
    assert [l["round"] for l in done] == list(range(1, rounds + 1))
    assert "killed" in events and "restarted" in events, events
    after = done[events["killed"]:]
    failed = [l["round"] for l in after if any(f["client"] == 2 for f in l["failed"])]
    assert failed and all(2 not in done[r - 1]["trained"] for r in failed)
    assert all({0, 1} <= set(l["trained"]) for l in after), [l["trained"] for l in done]
    assert any(2 in l["trained"] for l in done[events["restarted"]:]), [l["trained"] for l in done]
    assert max(l["wall_time_s"] for l in done) < round_timeout + 40, [l["wall_time_s"] for l in done]



def test_resume_refuses_algorithms_whose_client_state_lived_on_the_supernodes(tmp_path, task_identity):
    """The ServerApp with ``resume`` and SCAFFOLD stops at once, naming what is lost."""
    from neurofed.flower.app import server_app

    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"neurofed-set": tiny_set(**{"algorithm.name": "scaffold"}), "resume": True,
                              "out": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match=r"resume: scaffold keeps client state .*c_i.* lost"):
        server_app(HandGrid({}), ctx)



@pytest.mark.slow
@pytest.mark.parametrize("kill", ["after_round_2", "before_round_3_arrays"])
def test_a_killed_serverapp_resumes_from_its_checkpoint(tmp_path, kill):
    """FedAvg on a loopback deployment: the ServerApp process is killed (SIGKILL) after
    round 2, or between pushing round 3's messages and their arrays (the SuperNodes then
    give up messages their workers were already waiting for; issue 21); ``flwr run``
    with ``resume=true`` and the same ``out`` finishes the run, and the result equals an
    uninterrupted in-process run bit for bit."""
    import threading

    neurofed_set = tiny_set(**{"partition.num_clients": 2, "federation.rounds": 4})
    out, mark = tmp_path / "flower", tmp_path / "killed"
    env = {}
    if kill == "before_round_3_arrays":
        (tmp_path / "hook").mkdir()
        (tmp_path / "hook" / "sitecustomize.py").write_text(KILL_BEFORE_ROUND_3_ARRAYS)
        env = {"PYTHONPATH": f"{tmp_path / 'hook'}{os.pathsep}{REPO}", "KILL_MARK": str(mark)}
    lb = loopback(tmp_path, 2, tls=False, isolation="process", env=env)
    first: dict = {}
    try:
        lb.start()
        run = threading.Thread(target=lambda: first.update(lb.run(f"neurofed-set='{neurofed_set}' out='{out}'",
                                                                  timeout=900)), daemon=True)
        run.start()
        deadline = time.monotonic() + 900
        while kill == "after_round_2" and not mark.exists() and run.is_alive() and time.monotonic() < deadline:
            if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2:
                lb.procs.scan()
                for pid in lb.procs.alive():
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if b"flwr-serverapp" in cmd:
                        lb.procs.signal(pid, signal.SIGKILL)
                        mark.touch()
            time.sleep(0.1)
        run.join(timeout=600)
        assert mark.exists(), "no ServerApp process killed"
        assert first.get("status", "").startswith("finished:failed"), first
        rounds_before = len((out / "metrics.jsonl").read_text().splitlines())
        assert 2 <= rounds_before < 4
        second = lb.run(f"neurofed-set='{neurofed_set}' out='{out}' resume=true", timeout=900)
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert second["status"] == "finished:completed", second["output"][-3000:]
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
