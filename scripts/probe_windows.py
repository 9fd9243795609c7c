"""Probe of the lookahead window: whole greedy decodes of the policy and of ``la_rule`` at several windows.

    python scripts/probe_windows.py                 # the dev 2,000-node graphs (seeds 6 and 7, four families)
    python scripts/probe_windows.py --split dev     # the dev split's pairs

For every pair, the policy's greedy decode (``cost.decode.POLICY``, the shipped checkpoint) and the rule's
(``LA_RULE``) at W = 16, 32, 64, 128, 256 and the whole graph (where it has at most ``FULL_WINDOW`` nodes), each
timed; ratios are to ``la_rule`` at the policy's placing window. Then, per method, the best of the windows a
search's start would fit (``cost.decode.decode_windows``: W = 16, then the largest first) in 0.5, 1 and 2 s, as
a geometric mean over the pairs whose ``la_rule`` placement fits memory. Dev graphs only: the test split and the
benchmark's 2,000-node graphs (seed 5) are not read.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

BIG = [("layered", "2x4_v100_ib"), ("dataflow", "8x_v100_dgx1"), ("series_parallel", "4x_v100_nvlink"),
       ("transformer_like", "2x4_v100_ib")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="", choices=("", "dev"), help="the dev split's pairs instead")
    ap.add_argument("--cache", default=None, help="a directory keeping built tasks between runs")
    args = ap.parse_args()

    import torch

    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.agents.constructive_eval import warm_kernels
    from placement_rl.agents.policy_rollout import student_head
    from placement_rl.cost.decode import LA_RULE, POLICY, decode
    from placement_rl.cost.schedule import ScheduleState
    from placement_rl.cost.window import FULL_WINDOW, placing_window
    from placement_rl.envs.constructive_task import ConstructiveTask
    from placement_rl.studies.pretrain import build_tasks, split_specs

    torch.set_num_threads(1)
    specs = (split_specs("dev") if args.split else
             [{"graph": {"family": f, "num_nodes": 2000, "seed": s}, "topology": t, "id": f"{f}-2000s{s}@{t}"}
              for s in (6, 7) for f, t in BIG])
    tasks = build_tasks(specs, workers=1, cache=args.cache)
    policy, _, _ = load_policy(default_checkpoint())
    warm_kernels(policy)
    budgets = (0.5, 1.0, 2.0)
    best: dict[str, dict[float, list[float]]] = {m: {b: [] for b in budgets} for m in ("policy", "la_rule")}
    for t in tasks:
        g, c, topo = t.graph, t.costs, t.topology
        n = g.num_nodes
        head = student_head(policy, ConstructiveTask(g, topo, c)).arrays()
        wide = placing_window(n)
        windows = [w for w in (16, 32, 64, 128, 256) if w < n] + ([n] if n <= FULL_WINDOW else [])
        runs: dict[str, dict[int, tuple[float, float, bool]]] = {"policy": {}, "la_rule": {}}
        for w in windows:
            for m, ch, h in (("policy", POLICY, head), ("la_rule", LA_RULE, None)):
                t0 = time.perf_counter()
                st = ScheduleState(g, c, topo, episodes=1, window=w)
                decode(st, ch, h)
                runs[m][w] = (float(st.finish()[0]), time.perf_counter() - t0, bool(st.feasible()[0]))
        ref, _, ok = runs["la_rule"][min(wide, n)]
        print(f"{t.meta['id']:40s} {n:5d} " + " ".join(
            f"W{w if w < n else 'all'} {runs['policy'][w][0] / ref:.3f}/{runs['la_rule'][w][0] / ref:.3f}"
            for w in windows) + ("" if ok else "  (la_rule's placement overflows memory: left out)"), flush=True)
        if not ok:
            continue
        order = [16] + sorted((w for w in windows if w > 16), reverse=True)
        for m in runs:
            for b in budgets:  # the windows a start fits in b seconds: W = 16 first, then the largest that fit
                spent, got = 0.0, []
                for w in order:
                    if w in runs[m] and (not got or spent + runs[m][w][1] <= b):
                        spent += runs[m][w][1]
                        got.append(runs[m][w][0])
                best[m][b].append(min(got) / ref)
    print("ratios: policy / la_rule at W, to la_rule at the placing window; best of the windows that fit:")
    for m, per in best.items():
        print(f"  {m:8s} " + ", ".join(f"{b:g} s {float(np.exp(np.mean(np.log(v)))):.4f}" for b, v in per.items())
              + f" ({len(per[budgets[0]])} pairs)")


if __name__ == "__main__":
    main()
