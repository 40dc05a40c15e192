"""Where a federated round's time and memory go: train / aggregate / evaluate.

Runs real FedAvg rounds of ``examples/digits_fedavg.yaml`` (export and Lava off)
through :func:`neurofed.pipeline.run`, and per round prints

* the split of the round's wall time into local training, aggregation and the
  evaluation of the global model, as the runner logs them in ``metrics.jsonl``
  (``time_train_s``, ``time_aggregate_s``, ``time_eval_s``); target: aggregation
  below 5 % of a round;
* that only the selected clients trained (``Client.fit`` calls counted against the
  round's plan) and that evaluation ran once, on the whole test set (calls of the
  runner's ``evaluate`` counted, with the tensor it was given);

then the aggregation itself against a baseline on the same client updates:

* neurofed: ``Server.aggregate`` = one weighted matrix-vector product over the
  (clients x parameters) matrix of flat float32 vectors (also timed including the
  packing of each client's dict message into its flat vector);
* baseline: the per-tensor Python loop of reference FL code, averaging the clients'
  state dicts key by key (``avg[k] += w_i * sd_i[k]``) in torch;

also at S-VGG9 size (the zoo's ``svgg9`` parameter layout, random updates), where
the difference matters more. Memory: the bytes the server half retains
between rounds (every array reachable from it) against the flat model size, for
FedAvg (O(model)) and for SCAFFOLD (server c, O(model); plus the clients'
c_i, O(clients x model), kept on the client side — in process, by the runner),
and the process's peak RSS.

    python benchmarks/round_profile.py                  # 3 FedAvg + 2 SCAFFOLD rounds; RESULT line last
    python benchmarks/round_profile.py --rounds 5 --save    # also writes benchmarks/results/round_profile.txt
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import Report, machine_header, with_one_line_errors  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "digits_fedavg.yaml")


# ----------------------------------------------------------------------------- aggregation
def per_tensor_average(messages: list[dict], weights: list[int]) -> dict:
    """Baseline: sample-weighted state-dict averaging, one tensor and one client at a time."""
    total = float(sum(weights))
    avg = {}
    for msg, n in zip(messages, weights):
        for key, value in msg.items():
            t = torch.from_numpy(value) * (n / total)
            if key in avg:
                avg[key] += t
            else:
                avg[key] = t
    return avg


def best_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def compare_aggregation(server, spec, results, repeat: int) -> dict:
    """Time the server's aggregation and the per-tensor baseline on the same updates."""
    from neurofed.algorithms.base import FitResult

    messages = [spec.unpack(r.params.copy()) for r in results]  # what the clients sent
    weights = [r.num_examples for r in results]
    saved = server.params.copy()

    def vectorized():
        server.aggregate(1, results)

    def vectorized_with_packing():
        server.aggregate(1, [FitResult(r.cid, spec.pack(m), r.num_examples) for r, m in zip(results, messages)])

    t_vec = best_time(vectorized, repeat)
    t_pack = best_time(vectorized_with_packing, repeat)
    t_loop = best_time(lambda: per_tensor_average(messages, weights), repeat)
    server.aggregate(1, results)
    ours = server.params.copy()
    server.params = saved
    loop = spec.pack({k: v.numpy() for k, v in per_tensor_average(messages, weights).items()})
    return {"vectorized_s": t_vec, "vectorized_pack_s": t_pack, "loop_s": t_loop,
            "max_abs_diff": float(np.max(np.abs(ours.astype(np.float64) - loop))), "params": spec.size,
            "clients": len(results)}


# ----------------------------------------------------------------------------- memory
def retained_bytes(obj, skip=("cfg", "spec")) -> int:
    """Bytes of every numpy array / torch tensor reachable from ``obj`` (its attributes,
    dicts, lists, tuples), each counted once."""
    seen: set[int] = set()

    def walk(o) -> int:
        if id(o) in seen:
            return 0
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            return int(o.nbytes) if o.base is None or id(o.base) not in seen else 0
        if isinstance(o, torch.Tensor):
            return int(o.numel() * o.element_size())
        if isinstance(o, dict):
            return sum(walk(v) for v in o.values())
        if isinstance(o, (list, tuple, set)):
            return sum(walk(v) for v in o)
        if hasattr(o, "__dict__") and not isinstance(o, type):
            return sum(walk(v) for k, v in vars(o).items() if k not in skip)
        return 0

    return walk(obj)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


# ----------------------------------------------------------------------------- one profiled run
def profiled_run(cfg: dict, out: str) -> dict:
    """Run ``cfg`` with the in-process runner; count client fits and evaluations per round."""
    import neurofed.fl.evaluation as evaluation
    from neurofed.fl.experiment import Experiment
    from neurofed.pipeline import run

    fits: dict[int, list[int]] = {}
    evals: dict[int, list[tuple[bool, int]]] = {}
    kept: dict[int, list] = {}
    starts: list[float] = []
    holder = {}

    class Profiled(Experiment):
        def __init__(self, cfg):
            super().__init__(cfg)
            holder["exp"] = self
            fit = self.client.fit

            def counted_fit(ctx):
                fits.setdefault(self.current_round, []).append(ctx.data.cid)
                return fit(ctx)

            self.client.fit = counted_fit

        def run_round(self, rnd):
            self.current_round = rnd
            starts.append(time.perf_counter())
            record = super().run_round(rnd)
            kept[rnd] = self.last_results
            return record

    evaluate = evaluation.evaluate

    def counted_evaluate(model, x, y, cfg, seed):
        exp = holder["exp"]
        evals.setdefault(exp.current_round, []).append((x is exp.x_test, len(x)))
        return evaluate(model, x, y, cfg, seed)

    evaluation.evaluate = counted_evaluate
    try:
        t0 = time.perf_counter()
        summary = run(cfg, out, progress=False, after=False, experiment=Profiled)
        total = time.perf_counter() - t0
    finally:
        evaluation.evaluate = evaluate
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    # time from one round's start to the next: the round plus its checkpoint and log line
    loop = [b - a for a, b in zip(starts, starts[1:])]
    return {"records": records, "fits": fits, "evals": evals, "results": kept, "exp": holder["exp"],
            "summary": summary, "total_s": total, "round_loop_s": loop}


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=EXAMPLE)
    ap.add_argument("--rounds", type=int, default=3, help="FedAvg rounds (default 3)")
    ap.add_argument("--scaffold-rounds", type=int, default=2, help="SCAFFOLD rounds for the memory check (0: skip)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--repeat", type=int, default=200, help="timing repetitions of each aggregation (best kept)")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/round_profile.txt")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.scaffold_rounds < 0 or args.repeat < 1:
        ap.error("--rounds and --repeat must be >= 1, --scaffold-rounds >= 0")

    from neurofed.algorithms.base import FitResult
    from neurofed.config import load_config
    from neurofed.training.params import ParamSpec
    from neurofed.models import build_model

    report = Report()
    emit = report.emit

    overrides = [f"federation.rounds={args.rounds}", "export=false", *args.set]
    cfg = load_config(args.config, overrides)
    emit(machine_header("round_profile", "(shared machine: times are of this one run)"))
    emit(f"# config: {os.path.relpath(args.config, ROOT)} --set {' --set '.join(overrides)}")
    fed = cfg["federation"]
    emit(f"# {cfg['algorithm']['name']} on {cfg['data']['name']} ({cfg['model']['name']}, T={cfg['data']['timesteps']}): "
         f"{cfg['partition']['num_clients']} clients, {fed['clients_per_round']} per round, "
         f"{fed['local_epochs']} local epochs, batch {fed['batch_size']}, "
         f"fast kernels {'on' if fed.get('fast_kernels', True) else 'off'}, "
         f"federation.threads {fed.get('threads') or 'unset (torch default)'}")
    emit("# baseline for aggregation: per-tensor Python loop over the clients' state dicts (torch)")
    emit("")

    with tempfile.TemporaryDirectory() as tmp:
        run = profiled_run(cfg, os.path.join(tmp, "fedavg"))
        rss_fedavg = peak_rss_mb()
        exp = run["exp"]
        n_test = len(exp.y_test)
        emit(f"torch threads during the run: {torch.get_num_threads()}; round 1 includes one-time set-up "
             f"(first-call allocations, oneDNN primitives)")
        emit("round   wall s   train s (share)   aggregate ms (share)   eval s (share)   fits/selected   evals on test set")
        ok_fits = ok_evals = True
        shares = {"train": [], "agg": [], "eval": []}
        for rec in run["records"]:
            rnd, wall = rec["round"], rec["wall_time_s"]
            fits = run["fits"].get(rnd, [])
            evals = run["evals"].get(rnd, [])
            selected = rec["selected"]
            expected = [c for c in selected if c not in rec["stragglers"]]
            ok_fits &= sorted(fits) == sorted(expected) == sorted(rec["trained"] + [f["client"] for f in rec["failed"]])
            ok_evals &= len(evals) == 1 and all(is_test and n == n_test for is_test, n in evals)
            for key, field in (("train", "time_train_s"), ("agg", "time_aggregate_s"), ("eval", "time_eval_s")):
                shares[key].append(rec[field] / wall)
            emit(f"{rnd:5d}   {wall:6.2f}   {rec['time_train_s']:7.2f} ({100 * rec['time_train_s'] / wall:5.1f} %)"
                 f"   {1e3 * rec['time_aggregate_s']:9.3f} ({100 * rec['time_aggregate_s'] / wall:6.3f} %)"
                 f"   {rec['time_eval_s']:6.3f} ({100 * rec['time_eval_s'] / wall:4.1f} %)"
                 f"   {len(fits)}/{len(selected)} {sorted(fits)}"
                 f"   {len(evals)} x {evals[0][1] if evals else 0} samples")
        steps = [r.metrics.get("steps", 0) for res in run["results"].values() for r in res]
        emit(f"checks: only selected clients trained: {'yes' if ok_fits else 'NO'}; "
             f"evaluation once per round on the {n_test}-sample test set: {'yes' if ok_evals else 'NO'}")
        train_s = sum(r["time_train_s"] for r in run["records"])
        emit(f"local training: {sum(len(f) for f in run['fits'].values())} client fits, {sum(steps)} steps, "
             f"{1e3 * train_s / max(sum(steps), 1):.1f} ms per step (incl. encoding, optimizer, param load/pack)")
        if run["round_loop_s"]:
            extra = [l - r["wall_time_s"] for l, r in zip(run["round_loop_s"], run["records"])]
            emit(f"between rounds (checkpoint + metrics line): {1e3 * statistics.mean(extra):.1f} ms per round")
        agg_share = max(shares["agg"])
        emit(f"aggregation share of a round: max {100 * agg_share:.3f} % (target < 5 %)")
        emit("")

        # aggregation vs the per-tensor baseline, on the last round's real updates
        last = run["results"][run["records"][-1]["round"]]
        agg = compare_aggregation(exp.server, exp.spec, last, args.repeat)
        emit(f"aggregation of {agg['clients']} real client updates ({agg['params']} parameters, digits {cfg['model']['name']}):")
        emit(f"  neurofed Server.aggregate (flat vectors, one mat-vec): {1e3 * agg['vectorized_s']:8.3f} ms"
             f"   (+ packing the dict messages: {1e3 * agg['vectorized_pack_s']:.3f} ms)")
        emit(f"  baseline per-tensor state-dict loop:                   {1e3 * agg['loop_s']:8.3f} ms")
        ratio = agg["loop_s"] / agg["vectorized_pack_s"]
        emit(f"  ratio baseline/neurofed: {agg['loop_s'] / agg['vectorized_s']:.1f}x "
             f"({ratio:.1f}x counting the packing); max |difference| {agg['max_abs_diff']:.2e}")

        model_bytes = exp.spec.nbytes
        fedavg_server = retained_bytes(exp.server)
        emit("server memory retained between rounds (arrays reachable from the server half):")
        emit(f"  model (flat float32): {model_bytes} bytes")
        emit(f"  fedavg:   server {fedavg_server} bytes = {fedavg_server / model_bytes:.2f} x model; "
             f"per-client state {retained_bytes(exp.client_states)} bytes")
        scaffold = {}
        if args.scaffold_rounds:
            scfg = load_config(args.config, [f"federation.rounds={args.scaffold_rounds}", "export=false", *args.set,
                                             "algorithm.name=scaffold"])
            srun = profiled_run(scfg, os.path.join(tmp, "scaffold"))
            sexp = srun["exp"]
            s_server = retained_bytes(sexp.server)
            s_clients = retained_bytes(sexp.client_states)
            holders = len(sexp.client_states)
            scaffold = {"server": s_server, "clients": s_clients}
            emit(f"  scaffold: server {s_server} bytes = {s_server / model_bytes:.2f} x model (x and c); "
                 f"per-client c_i {s_clients} bytes = {holders} clients x {s_clients / max(holders, 1) / model_bytes:.2f}"
                 f" x model after {args.scaffold_rounds} rounds (O(clients x model), kept client side)")
        emit(f"peak RSS of this process: {rss_fedavg:.0f} MB after the FedAvg run, {peak_rss_mb():.0f} MB after "
             f"SCAFFOLD (torch + lava imports, data, models; freed memory stays mapped for reuse, see "
             f"neurofed.kernels.tune_malloc)")
        emit("")

        # the same at S-VGG9 size (parameter layout of the zoo model, random updates)
        big = build_model({"name": "svgg9", "width": 1.0}, (3, 32, 32), 10, 1.0)
        big_spec = ParamSpec.from_model(big)
        del big
        rng = np.random.default_rng(0)
        fake = [FitResult(c, rng.standard_normal(big_spec.size, dtype=np.float32), int(n))
                for c, n in enumerate(rng.integers(100, 200, fed["clients_per_round"]))]
        big_server = exp.algorithm.Server(cfg, big_spec, np.zeros(big_spec.size, np.float32),
                                            exp.server.context)
        agg_big = compare_aggregation(big_server, big_spec, fake, max(3, args.repeat // 20))
        emit(f"aggregation at S-VGG9 size ({agg_big['params']} parameters in {len(big_spec.names)} tensors, "
             f"{agg_big['clients']} clients):")
        emit(f"  neurofed {1e3 * agg_big['vectorized_s']:.2f} ms (+ packing {1e3 * agg_big['vectorized_pack_s']:.2f} ms)"
             f"   baseline {1e3 * agg_big['loop_s']:.2f} ms   ratio {agg_big['loop_s'] / agg_big['vectorized_s']:.1f}x "
             f"({agg_big['loop_s'] / agg_big['vectorized_pack_s']:.1f}x counting the packing); "
             f"max |difference| {agg_big['max_abs_diff']:.2e}")
        del fake, big_server
        emit("")

    rec = run["records"]
    emit(f"RESULT name=round_profile rounds={len(rec)} "
         f"round_s={statistics.mean(r['wall_time_s'] for r in rec):.2f} "
         f"train_share={statistics.mean(shares['train']):.3f} agg_share={agg_share:.5f} "
         f"eval_share={statistics.mean(shares['eval']):.3f} "
         f"only_selected_trained={int(ok_fits)} eval_once={int(ok_evals)} "
         f"agg_ms={1e3 * agg['vectorized_pack_s']:.3f} baseline_agg_ms={1e3 * agg['loop_s']:.3f} "
         f"svgg9_ratio={agg_big['loop_s'] / agg_big['vectorized_pack_s']:.1f} "
         f"model_bytes={model_bytes} fedavg_server_bytes={fedavg_server} "
         + (f"scaffold_server_bytes={scaffold['server']} scaffold_client_bytes={scaffold['clients']} " if scaffold else "")
         + f"peak_rss_mb={rss_fedavg:.0f} ratio={ratio:.1f}")
    if args.save:
        report.save("round_profile")
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))