"""What a federated round costs under Flower, and where the time goes.

The same config (``examples/digits_fedavg.yaml``, 3 clients, all 3 per round, one
torch thread each, export and energy off) run three ways, per round:

* ``inprocess``: :func:`neurofed.pipeline.run` (the clients train one after another);
* ``simulation``: Flower's simulation engine (``run_simulation``, one Ray actor, in a
  fresh process; the per-round times exclude Ray's start);
* ``deployment``: the README's deployment recipe on loopback
  (:class:`neurofed.flower.loopback.Loopback`: a SuperLink over TLS with a CA made here,
  3 SuperNodes verifying it, ``flwr run .`` building the app bundle that the SuperLink's
  ServerApp installs and runs), with the ClientApp either long-lived (``--isolation
  process`` + ``python -m neurofed.flower.worker --insecure`` on the SuperNode's local
  Runtime API, as the README) or in Flower's default new process per message
  (``--isolation subprocess``). Each component gets ``PYTHONPATH`` = this checkout
  (what installing it on every machine gives). The run's ``summary.json`` says which
  fast-kernel variant the ServerApp loaded; the benchmark prints it and stops if it
  loaded none (a deployment then evaluates with stock SLAYER, several times slower).

Each Flower reply carries the ClientApp's step times (process start-up to the
handler: interpreter, imports of torch/lava/SLAYER, FAB install, app load; set-up:
data set, shards, models, kernels; decode; fit; encode). A deployment round's
*overhead* is its training phase (first message sent to last reply decoded) minus
the longest client's fit (the clients train at the same time on their SuperNodes);
what the ClientApp's own steps do not explain is transport and polling: the
SuperNode's idle pull (every 3 s in flwr 1.41), its wait for the ClientApp's reply
(0.5 s steps), the SuperExec's task poll (1 s) and the ServerApp's reply poll (3 s in
Flower's ``send_and_receive``, ``reply-poll`` here). Besides the runs: a fresh
interpreter importing the ClientApp, building a SuperNode's :class:`Node`, and the
(de)serialisation of one model message, each timed alone.

    python benchmarks/flower_rounds.py                       # all modes, 4 rounds
    python benchmarks/flower_rounds.py --modes inprocess,deployment --isolation process --no-parts
    python benchmarks/flower_rounds.py --modes deployment --isolation subprocess --app /path/to/older/checkout
    python benchmarks/flower_rounds.py --save                # also benchmarks/results/flower_rounds.txt

``--app`` runs the deployment from another checkout's code (the FAB ``flwr run``
builds there), e.g. to measure a version before these changes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from common import Report, machine_header, with_one_line_errors  # noqa: E402

EXAMPLE = "examples/digits_fedavg.yaml"
SIMULATE = """
import json, sys
from neurofed.flower.app import flower_apps
from flwr.simulation import run_simulation
server_app, client_app = flower_apps(**json.loads(sys.argv[1]))
run_simulation(server_app, client_app, num_supernodes=int(sys.argv[2]),
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"num_cpus": 1, "num_gpus": 0}})
"""


def overrides(clients: int, rounds: int) -> list[str]:
    return [f"partition.num_clients={clients}", f"federation.clients_per_round={clients}",
            f"federation.rounds={rounds}", "export=false", "energy.enabled=false", "federation.threads=1"]


def read_rounds(out: Path) -> list[dict]:
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]


def env() -> dict:
    from neurofed.flower.loopback import QUIET

    return {**os.environ, **QUIET, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


# ----------------------------------------------------------------------------- the runs
def run_inprocess(work: Path, sets: list[str]) -> list[dict]:
    from neurofed.config import load_config
    from neurofed.pipeline import run

    out = work / "inprocess"
    run(load_config(ROOT / EXAMPLE, sets), out, progress=False, after=False)
    return read_rounds(out), server_kernels(out)


def run_simulation(work: Path, sets: list[str], clients: int) -> tuple[list[dict], float]:
    out = work / "simulation"
    settings = {"neurofed-config": EXAMPLE, "neurofed-set": " ".join(sets), "out": str(out)}
    for attempt in (1, 2):  # Ray's start can time out on a loaded machine
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", SIMULATE, json.dumps(settings), str(clients)], cwd=ROOT,
                             env=env(), capture_output=True, text=True, timeout=1800)
        if res.returncode == 0:
            return read_rounds(out), time.perf_counter() - t0
    raise RuntimeError(f"simulation failed twice: {(res.stdout + res.stderr)[-3000:]}")


def server_kernels(out: Path) -> str:
    """The fast-kernel variant the run's server process loaded (its summary), or why none."""
    k = json.loads((out / "summary.json").read_text()).get("kernels")
    if k is None:  # an app from before summaries recorded it (--app)
        return "not recorded"
    return k["variant"] if k["enabled"] else f"none ({k.get('error')})"


def run_deployment(work: Path, sets: list[str], clients: int, isolation: str, app: Path,
                   tls: bool = True) -> tuple[list[dict], float, str]:
    from neurofed.flower.loopback import Loopback

    folder = work / f"deployment-{isolation}"
    out = folder / "run"
    lb = Loopback(folder, clients, tls=tls, runtime_tls=False, isolation=isolation,
                  env={"PYTHONPATH": env()["PYTHONPATH"]}, app=app)
    try:
        lb.start()
        t0 = time.perf_counter()
        res = lb.run(f"neurofed-set='{' '.join(sets)}' out='{out}'", timeout=1800)
        total = time.perf_counter() - t0
    finally:
        left = lb.stop()
    if res["status"] != "finished:completed":
        raise RuntimeError(f"deployment run {res['status']}: {res['output'][-3000:]}")
    if left:
        raise RuntimeError(f"processes survived the deployment: {left}")
    return read_rounds(out), total, server_kernels(out)


# ----------------------------------------------------------------------------- parts timed alone
def import_seconds(repeat: int = 2) -> float:
    """A fresh interpreter importing the ClientApp (torch, lava, SLAYER, flwr, neurofed)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import neurofed.flower.app"], cwd=ROOT, env=env(), check=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def setup_seconds(sets: list[str]) -> float:
    """Build a SuperNode's Node: read the data set, cut the shards, build the models and
    load the fast kernels (what every new ClientApp process repeats)."""
    from neurofed.flower.client import Node
    from neurofed.flower.settings import experiment_config

    cfg = experiment_config({"neurofed-config": EXAMPLE, "neurofed-set": " ".join(sets)})
    t0 = time.perf_counter()
    Node(cfg)
    return time.perf_counter() - t0


def serialisation_seconds(sets: list[str]) -> tuple[float, int]:
    """One model download and its upload through Flower's records and object bytes."""
    from flwr.app import RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from neurofed.fl.experiment import Experiment
    from neurofed.flower.records import from_arrays, to_arrays
    from neurofed.flower.settings import experiment_config

    exp = Experiment(experiment_config({"neurofed-config": EXAMPLE, "neurofed-set": " ".join(sets)}))
    params = exp.server.message()
    best, size = float("inf"), 0
    for _ in range(5):
        t0 = time.perf_counter()
        content = RecordDict({"arrays": to_arrays(params)})
        blobs = [o.deflate() for o in get_all_nested_objects(content).values()]
        from_arrays(content["arrays"])
        best, size = min(best, time.perf_counter() - t0), sum(len(b) for b in blobs)
    return best, size


# ----------------------------------------------------------------------------- report
def mean(xs) -> float:
    xs = list(xs)
    return statistics.fmean(xs) if xs else float("nan")


def client_split(r: dict, serial: bool = False) -> dict:
    """Per round: the longest client's fit (the sum if the clients ran one after
    another) and the largest of each other ClientApp step."""
    tc = r.get("time_clients") or {}
    steps = ("start", "setup", "decode", "fit", "encode")
    split = {s: max((t.get(s, 0.0) for t in tc.values()), default=float("nan")) for s in steps}
    if serial and tc:
        split["fit"] = sum(t.get("fit", 0.0) for t in tc.values())
    return split


def describe(rep: Report, name: str, rounds: list[dict], base: float | None, serial: bool = False) -> dict:
    """Per-round lines; ``serial``: the clients trained one after another (one Ray
    actor), so the overhead is the training phase minus the sum of the fits."""
    later = rounds[1:] or rounds
    wall = mean(r["wall_time_s"] for r in later)
    rep.emit(f"\n{name}")
    rep.emit(f"round   wall s   train s   eval s   client: start  setup  fit({'sum' if serial else 'max'})"
             f"  decode+encode   overhead s")
    for r in rounds:
        c = client_split(r, serial)
        over = r["time_train_s"] - c["fit"] if r.get("time_clients") else float("nan")
        rep.emit(f"{r['round']:5d} {r['wall_time_s']:8.2f} {r['time_train_s']:9.2f} {r['time_eval_s']:8.2f}"
                 f"   {c['start']:12.2f} {c['setup']:6.2f} {c['fit']:9.2f} {c['decode'] + c['encode']:14.4f}"
                 f"   {over:10.2f}")
    res = {"round_s": wall, "round1_s": rounds[0]["wall_time_s"]}
    if later[0].get("time_clients"):
        res["overhead_s"] = mean(r["time_train_s"] - client_split(r, serial)["fit"] for r in later)
        res["fit_s"] = mean(client_split(r, serial)["fit"] for r in later)
    line = f"rounds 2..{rounds[-1]['round']}: {wall:.2f} s per round"
    if base:
        line += f" = {wall / base:.2f} x in-process"
    if "overhead_s" in res:
        what = "the clients' fits" if serial else "the longest client's fit"
        line += f"; overhead beyond {what} {res['overhead_s']:.2f} s (fit {res['fit_s']:.2f} s)"
    rep.emit(line)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="inprocess,simulation,deployment")
    ap.add_argument("--isolation", default="process,subprocess",
                    help="deployment ClientApp isolation(s): process (long-lived worker), subprocess (Flower's default)")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--app", type=Path, default=ROOT, help="checkout whose code the deployment runs")
    ap.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True,
                    help="the SuperLink over TLS, as the README's recipe (--no-tls: plain HTTP)")
    ap.add_argument("--parts", action=argparse.BooleanOptionalAction, default=True, help="time the parts alone")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    sets = overrides(args.clients, args.rounds)

    rep = Report()
    rep.emit(machine_header("flower_rounds", "(shared machine: compare ratios within one run)"))
    rep.emit(f"# config: {EXAMPLE} --set {' '.join(sets)}; flwr 1.41, loopback, {'TLS' if args.tls else 'no TLS'}; "
             f"app: {args.app}")
    if os.environ.get("NEUROFED_EXT_DIR"):
        rep.emit(f"# fast-kernel cache: NEUROFED_EXT_DIR={os.environ['NEUROFED_EXT_DIR']}")
    work = Path(tempfile.mkdtemp(prefix="flower_rounds_"))
    result = {}
    try:
        if args.parts:
            imp, setup = import_seconds(), setup_seconds(sets)
            ser, nbytes = serialisation_seconds(sets)
            rep.emit("\nparts timed alone:")
            rep.emit(f"  fresh interpreter importing the ClientApp (torch, lava, SLAYER, flwr): {imp:6.2f} s")
            rep.emit(f"  SuperNode set-up (data set, shards, models, fast kernels):              {setup:6.2f} s")
            rep.emit(f"  one model message encoded to Flower objects and decoded ({nbytes} B):  {ser * 1e3:6.2f} ms")
            result.update(import_s=imp, setup_s=setup, serialise_ms=ser * 1e3)
        base = None
        if "inprocess" in modes:
            rounds, kernels = run_inprocess(work, sets)
            base = describe(rep, f"in process (neurofed run; fast kernels {kernels})", rounds, None)["round_s"]
            result["inprocess_round_s"] = base
        if "simulation" in modes:
            rounds, total = run_simulation(work, sets, args.clients)
            res = describe(rep, f"Flower simulation engine (1 Ray actor; whole run with Ray's start {total:.0f} s)",
                           rounds, base, serial=True)
            result["simulation_round_s"] = res["round_s"]
            if base:
                result["simulation_ratio"] = res["round_s"] / base
        if "deployment" in modes:
            for iso in args.isolation.split(","):
                rounds, total, kernels = run_deployment(work, sets, args.clients, iso, args.app, args.tls)
                what = ("long-lived ClientApp: --isolation process + neurofed.flower.worker" if iso == "process"
                        else "Flower's default --isolation subprocess: a new ClientApp process per message")
                res = describe(rep, f"loopback deployment{' over TLS' if args.tls else ''}, {args.clients} SuperNodes, "
                                    f"{what} (flwr run to finish {total:.0f} s; ServerApp fast kernels {kernels})",
                               rounds, base)
                if kernels.startswith("none"):
                    raise RuntimeError(f"the deployed ServerApp ran stock SLAYER: {kernels}")
                result[f"deploy_{iso}_round_s"] = res["round_s"]
                if "overhead_s" in res:
                    result[f"deploy_{iso}_overhead_s"] = res["overhead_s"]
                if base:
                    result[f"deploy_{iso}_ratio"] = res["round_s"] / base
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rep.emit(f"\n# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rep.emit("\nRESULT name=flower_rounds " + " ".join(f"{k}={v:.3g}" for k, v in result.items()))
    if args.save:
        rep.save("flower_rounds")
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))