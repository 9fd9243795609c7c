"""RL benchmarks: training throughput, learned vs baselines on the evaluate suite, zero-shot speed.

    python scripts/bench_rl.py [--part all|throughput|suite|zeroshot] [--steps 20000] [--pipeline-steps 30000]
                               [--cases nmt/2xK80,...] [--kinds placement,pipeline] [--seed 0]

(a) throughput: env steps per second of PPO + SAGE ``learn()`` (rollouts *and* updates) on synthetic 32- and
    200-node graphs, one torch thread, per second of this process's CPU time (other processes on the machine
    do not count) and per wall second. Target: >= 2,000/s at 32 nodes.
(b) suite: for each case of ``placement_rl.evaluate.DEFAULT_SUITE`` the learned op-level placement (MaskablePPO +
    SAGE on ``PlacementEnv`` warm-started from the incumbent), and on the suite's pipeline cases a learned
    ``StagePlan`` (``PipelineEnv``); each baseline gets the simulator calls the training used. Prints learned /
    best baseline (target <= 1.00 everywhere, <= 0.95 on half) and the gap to the exhaustive optimum where it is
    computable (target within 3%).
(c) zero-shot: a policy trained on small synthetic graphs places 100..2,000-node graphs with one forward pass
    plus best-of-8 sampling scored by the simulator; wall seconds per graph, env set-up included (target < 1 s).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from placement_rl.agents.rollout import load_policy_for, zero_shot_place  # noqa: E402
from placement_rl.studies.suite import run_case, summarize  # noqa: E402
from placement_rl.agents.train import AgentSpec, EncoderSpec, Trainer  # noqa: E402
from placement_rl.envs.warm_start import make_env  # noqa: E402
from placement_rl.evaluate import DEFAULT_PIPELINE_CASES, DEFAULT_SUITE  # noqa: E402
from placement_rl.graph import synthetic  # noqa: E402


def throughput(num_nodes: int, steps: int, seed: int) -> tuple[float, float]:
    g = synthetic.sample("layered", num_nodes=num_nodes, seed=seed)
    tr = Trainer(env_id="placement_rl/PlacementEnv-v0", env_kwargs={"graph": g, "topology": "4x_v100_nvlink"},
                 agent=AgentSpec(algo="ppo"), encoder=EncoderSpec(name="sage"), seed=seed)
    tr.learn(1024, progress=False)  # warm-up: first rollouts, lazy imports
    cpu, wall = time.process_time(), time.perf_counter()
    tr.learn(steps, progress=False)
    return steps / (time.process_time() - cpu), steps / (time.perf_counter() - wall)


def part_throughput(args) -> None:
    print("(a) PPO + SAGE learn() throughput, 1 thread (defaults: "
          f"{AgentSpec(algo='ppo')}, {EncoderSpec()})")
    for n, steps in ((32, 16384), (200, 4096)):
        cpu, wall = throughput(n, steps, args.seed)
        print(f"  {n:4d} nodes: {cpu:7.0f} steps per CPU-second   ({wall:7.0f} per wall second)"
              + ("   target >= 2000" if n == 32 else ""), flush=True)


def part_suite(args) -> None:
    names = args.cases.split(",") if args.cases else [c.name for c in DEFAULT_SUITE]
    cases = {c.name: c for c in DEFAULT_SUITE}
    print(f"(b) learned / best baseline at equal simulator calls (op-level: {args.steps} steps; pipeline: "
          f"{args.pipeline_steps} steps)")
    print(f"  {'case':<26} {'kind':<9} {'calls':>6} {'train_s':>7} {'learned_ms':>10} {'best baseline':>24} "
          f"{'ratio':>7} {'optimum gap':>11}")
    results = []
    from placement_rl.evaluate import load_case

    for name in names:
        if name not in cases:
            raise SystemExit(f"unknown case {name!r} (choose from {', '.join(cases)})")
        problem = load_case(cases[name])
        kinds = [k for k in args.kinds.split(",")
                 if k == "placement" or (k == "pipeline" and name in DEFAULT_PIPELINE_CASES)]
        for kind in kinds:
            steps = args.steps if kind == "placement" else args.pipeline_steps
            r = run_case(cases[name], kind=kind, steps=steps, seed=args.seed, problem=problem,
                         optimum_budget=args.optimum_budget)
            results.append(r)
            base = (f"{r.best_baseline} {r.best_baseline_time * 1e3:.3f}" if r.best_baseline
                    else "none feasible")
            gap = "" if r.optimum_gap is None else f"{100 * r.optimum_gap:+.2f}%"
            print(f"  {name:<26} {kind:<9} {r.sim_calls:6d} {r.train_seconds:7.1f} "
                  f"{r.learned_time * 1e3:10.3f}{'' if r.learned_feasible else '!'} {base:>24} {r.ratio:7.4f} "
                  f"{gap:>11}", flush=True)
    s = summarize(results)
    print(f"  summary: {s['at_most_1.00']}/{s['with_feasible_baseline']} rows <= 1.00, {s['at_most_0.95']}/"
          f"{s['with_feasible_baseline']} rows <= 0.95 (rows without a feasible baseline: "
          f"{s['cases'] - s['with_feasible_baseline']}); {s['within_3pct_of_optimum']}/{s['with_optimum']} "
          f"within 3% of the exhaustive optimum ('!' = infeasible)")


def part_zeroshot(args) -> None:
    topo = "8x_a100_nvswitch"  # 2,000-node layered graphs need ~6 V100s of memory: room to be feasible
    tr = Trainer(env_id="placement_rl/PlacementEnv-v0",
                 env_kwargs={"graph": "synthetic:layered,series_parallel,transformer_like,cnn_like",
                             "topology": topo}, agent=AgentSpec(), encoder=EncoderSpec(), seed=args.seed)
    tr.learn(args.zeroshot_steps, progress=False)
    state = tr.policy.state_dict()
    d = tr.obs_info()["max_devices"]
    print(f"(c) zero-shot placement (policy trained {args.zeroshot_steps} steps on 16-32-node synthetic graphs; "
          "one pass + best of 8 samples; wall time includes cost resolution and env set-up)")
    for n in (100, 500, 1000, 2000):
        g = synthetic.sample("layered", num_nodes=n, seed=args.seed + n)
        start = time.perf_counter()
        env = make_env("placement_rl/PlacementEnv-v0", {"graph": g, "topology": topo, "max_devices": d})
        policy = load_policy_for(env, state, tr.encoder.kwargs())
        res = zero_shot_place(policy, env, samples=8, seed=args.seed)
        wall = time.perf_counter() - start
        single = env.unwrapped.state.best_single
        print(f"  {n:5d} nodes: {wall:6.3f} s   step time {res.step_time / single:.4f} x best single device "
              f"({'feasible' if res.feasible else 'INFEASIBLE'}, {res.chosen})   target < 1 s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=["all", "throughput", "suite", "zeroshot"])
    ap.add_argument("--steps", type=int, default=20000, help="op-level training steps per suite case")
    ap.add_argument("--pipeline-steps", type=int, default=30000, help="pipeline training steps per case")
    ap.add_argument("--zeroshot-steps", type=int, default=8192)
    ap.add_argument("--optimum-budget", type=int, default=250000,
                    help="largest exhaustive search run to know a case's optimum")
    ap.add_argument("--cases", default="", help="comma-separated suite case names (default: all)")
    ap.add_argument("--kinds", default="placement,pipeline", help="placement and/or pipeline rows")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    np.set_printoptions(precision=4)
    if args.part in ("all", "throughput"):
        part_throughput(args)
    if args.part in ("all", "zeroshot"):
        part_zeroshot(args)
    if args.part in ("all", "suite"):
        part_suite(args)


if __name__ == "__main__":
    main()
