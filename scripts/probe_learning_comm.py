"""Probe of learning from search where search finds the most: communication-heavy dataflow graphs (dev seeds only).

    python scripts/probe_learning_comm.py room --seconds 5        # how far la_rule is from search, and why
    python scripts/probe_learning_comm.py clone --target search   # expert iteration, the searched placement cloned
    python scripts/probe_learning_comm.py clone --target minimal  # ... only the changes that pay (a minimal edit)
    python scripts/probe_learning_comm.py clone --dagger          # ... the student's own states labelled with it
    python scripts/probe_learning_comm.py clone --target minimal --replay 24   # ... with la_rule replayed elsewhere
    python scripts/probe_learning_comm.py links                   # la_rule deciding on links lambda x slower
    python scripts/probe_learning_comm.py edges --seconds 5       # la_rule told which edges search keeps together
    python scripts/probe_learning_comm.py prefix --seconds 5      # search's first decisions, la_rule the rest
    python scripts/probe_learning_comm.py rollout                 # rollout over la_rule, and can a student learn it

The dev-comm pairs: three dataflow graphs and one series-parallel graph (seed 777, never a test seed) on the DGX-1
and on a heterogeneous-link random cluster, both with links 4x slower, and on the DGX A100 (12 pairs, the kind of
pair where the test split's room lies). ``room``: per pair, ``la_rule``, ``la_rule`` on the k fastest devices (the
best k: "use fewer devices"), ``la_rule_search`` and ``local_search`` at ``--seconds``, each as a ratio to
``la_rule``, and how many devices each uses. ``clone``: expert iteration from the shipped policy on comm-heavy training
tasks (24 drawn, those that fit memory: the training families at 150-600 nodes on random clusters, 70% with links
4x slower, seed 4242), each round a multi-start annealing (``agents.expert_iteration.search_job``) from the
student's, ``la_rule``'s and the best known placement; the target is the best known placement (``search``) or it
with every change from the student's own placement that does not pay (within ``--tol``) reverted (``minimal``);
cloned along the target's own trajectory (and with ``--dagger`` also the student's trajectory labelled with the
target's devices; ``--replay N``: also ``la_rule``'s own trajectories on N other training-like tasks, seed 4343, so
the student keeps its rule). The dev-comm greedy over ``la_rule`` after each round (``--replay``: the dev split's
too), the dev split's at the end (the best round kept). ``links``: ``la_rule`` deciding on the topology with every
link ``lambda`` times slower (its costs resolved there), the placement run on the true one, per pair of the dev-comm
set and the dev split, and the best lambda per pair (the most a learned per-pair choice of lambda could give).
``edges``: an oracle for learned per-edge weights ("which subgraphs to keep together"): ``la_rule`` deciding on edge
bytes scaled by ``s`` where ``la_rule_search``'s best placement (``--seconds``) keeps the edge on one device
(``in<s>``), or by ``1/s`` where it cuts it (``cut<s>``), the placement run on the true graph; per dev-comm pair,
each as a ratio to ``la_rule``, with the search's own ratio. If the oracle misses, a model predicting those edges does.
``prefix``: how much of the search's gain a one-pass decoder keeps when it makes the first ``f`` of its decisions
(the simulator's order) as the search's best placement does and ``la_rule`` makes the rest (``f`` in ``PREFIXES``):
what imitating the search along its own trajectory can give before the student errs at all.
``rollout``: the one-pass improvement of the rule itself, on small pairs (``small_specs``: dataflow, series-parallel
and transformer-like graphs of 60-140 nodes, seed 778, on the same three clusters): at every decision each device is
tried and the rest of the graph placed by ``la_rule``, the best completed placement followed (rollout over
``la_rule``, fortified: never slower than it; also on the decisions of each of ``SPANS`` only), against
``la_rule_search`` and ``local_search`` given its seconds (the median and best of three seeds); then dense approximate policy iteration from the shipped policy
(``ConstructiveTrainer.policy_iteration``, every state of the student's trajectory labelled by the rollout over the
student, ``--rounds`` rounds of ``--epochs`` epochs) on ``--pi-tasks`` small training tasks (seed 4244, 60-180 nodes,
random clusters of 4-8 devices, 70% with links 4x slower): the agreement with the labels, how often they depart from
the student, and the student's greedy over ``la_rule`` on the training tasks and on the small pairs after each round.
Writes ``results/<stem>.json`` (default ``probe_learning_comm_<part>``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def gm(x) -> float:
    x = [v for v in x if np.isfinite(v)]
    return float(np.exp(np.mean(np.log(x)))) if x else float("nan")


def dev_comm_specs() -> list[dict]:
    rng = np.random.default_rng(777)
    graphs = [{"family": "dataflow", "num_nodes": int(rng.integers(200, 500)), "seed": int(rng.integers(2**31))}
              for _ in range(3)]
    graphs.append({"family": "series_parallel", "num_nodes": int(rng.integers(300, 700)),
                   "seed": int(rng.integers(2**31))})
    return _on_comm_clusters(rng, graphs)


def _on_comm_clusters(rng: np.random.Generator, graphs: list[dict]) -> list[dict]:
    """Each graph on the DGX-1 and a heterogeneous-link random cluster (drawn from ``rng``), both with links 4x
    slower, and on the DGX A100: the clusters of the dev-comm pairs (``dev_comm_specs``, ``small_specs``)."""
    from placement_rl.studies.splits import COMM_LINK_SCALE, _hetero_seed, topology_label

    topos = [{"preset": "8x_v100_dgx1", "link_scale": COMM_LINK_SCALE},
             {"random": _hetero_seed(rng, (4, 8)), "devices": [4, 8], "link_scale": COMM_LINK_SCALE}, "8x_a100_dgx"]
    return [{"graph": g, "topology": t, "id": f"{g['family']}-{g['num_nodes']}s{g['seed'] % 1000}@{topology_label(t)}"}
            for g in graphs for t in topos]


def train_specs(n: int = 24, *, seed: int = 4242, families: tuple[str, ...] = (
        "dataflow", "dataflow", "layered", "transformer_like", "cnn_like"), nodes: tuple[int, int] = (150, 600),
        devices: tuple[int, int] = (4, 12), prefix: str = "train") -> list[dict]:
    """Comm-heavy training-like tasks (``clone``; ``pi_specs`` with its own draw): random clusters, 70% with links
    4x slower."""
    from placement_rl.studies.splits import COMM_LINK_SCALE

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        g = {"family": families[int(rng.integers(len(families)))], "num_nodes": int(rng.integers(*nodes)),
             "seed": int(rng.integers(2**31))}
        t = {"random": int(rng.integers(2**31)), "devices": list(devices)}
        if rng.random() < 0.7:
            t["link_scale"] = COMM_LINK_SCALE
        out.append({"graph": g, "topology": t, "id": f"{prefix}{i}-{g['family']}"})
    return out


def replay_specs(n: int) -> list[dict]:
    """Training-like tasks (every family, 100-600 nodes, random clusters at the true link speeds) for ``--replay``."""
    rng = np.random.default_rng(4343)
    fams = ("dataflow", "layered", "transformer_like", "cnn_like", "series_parallel")
    return [{"graph": {"family": fams[int(rng.integers(len(fams)))], "num_nodes": int(rng.integers(100, 600)),
                       "seed": int(rng.integers(2**31))},
             "topology": {"random": int(rng.integers(2**31)), "devices": [2, 12]}, "id": f"replay{i}"}
            for i in range(n)]


LAMBDAS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)


def links(args, tasks) -> dict:
    import dataclasses

    from placement_rl.cost import Simulator, resolve_costs
    from placement_rl.studies.pretrain import build_tasks, split_specs

    out = {}
    for name, ts in (("dev_comm", tasks), ("dev", build_tasks(split_specs("dev"), workers=1, cache=args.cache))):
        rows = []
        for t in ts:
            g, c, topo = t.graph, t.costs, t.topology
            ref, _, _ = _la_rule(g, c, topo)
            sim = Simulator(g, c, topo)
            row = {"pair": t.meta.get("id", g.name)}
            for lam in LAMBDAS:
                slow = dataclasses.replace(topo, link_bandwidth=topo.link_bandwidth / lam,
                                           link_latency=topo.link_latency * lam)
                _, _, dev = _la_rule(g, resolve_costs(g, slow), slow)
                r = sim.run(dev)
                row[f"lambda_{lam:g}"] = r.step_time / ref if r.feasible else float("inf")
            row["best"] = min(row[f"lambda_{lam:g}"] for lam in LAMBDAS)
            rows.append(row)
        summary = {k: gm([r[k] for r in rows]) for k in rows[0] if k != "pair"}
        print(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in summary.items()), flush=True)
        out[name] = {"summary": summary, "rows": rows}
    return out


EDGE_SCALES = (2.0, 4.0, 16.0)


def edges(args, tasks) -> dict:
    from placement_rl import baselines
    from placement_rl.cost import Simulator

    rows = []
    for t in tasks:
        g, c, topo = t.graph, t.costs, t.topology
        sim = Simulator(g, c, topo)
        ref, _, _ = _la_rule(g, c, topo)
        p = baselines.get("la_rule_search")(g, c, topo, budget=10**9, seed=args.seed, seconds=args.seconds)
        best = p.device_of_node
        same = best[g.edges[:, 0]] == best[g.edges[:, 1]]
        row = {"pair": t.meta["id"], "search": float(p.meta["step_time"]) / ref, "kept_together": float(same.mean())}
        for s in EDGE_SCALES:
            for key, factor in ((f"in{s:g}", np.where(same, s, 1.0)), (f"cut{s:g}", np.where(same, 1.0, 1.0 / s))):
                _, _, dev = _la_rule(g, c, topo, edge_factor=factor)
                r = sim.run(dev)
                row[key] = r.step_time / ref if r.feasible else float("inf")
        row["oracle_best"] = min(v for k, v in row.items() if k.startswith(("in", "cut")))
        rows.append(row)
        print(f"{row['pair']:44s} search {row['search']:.3f}, oracle best {row['oracle_best']:.3f} "
              f"(in4 {row['in4']:.3f}, cut4 {row['cut4']:.3f})", flush=True)
    summary = {k: gm([r[k] for r in rows]) for k in rows[0] if k != "pair"}
    print(", ".join(f"{k} {v:.4f}" for k, v in summary.items()))
    return {"seconds": args.seconds, "summary": summary, "rows": rows}


PREFIXES = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def prefix(args, tasks) -> dict:
    from placement_rl import baselines
    from placement_rl.cost.decode import FORCED, LA_RULE, decode
    from placement_rl.cost.schedule import ScheduleState
    from placement_rl.cost.window import placing_window

    rows = []
    for t in tasks:
        g, c, topo = t.graph, t.costs, t.topology
        ref, _, _ = _la_rule(g, c, topo)
        p = baselines.get("la_rule_search")(g, c, topo, budget=10**9, seed=args.seed, seconds=args.seconds)
        row = {"pair": t.meta["id"], "search": float(p.meta["step_time"]) / ref}
        for f in PREFIXES:
            st = ScheduleState(g, c, topo, episodes=1, window=placing_window(g.num_nodes))
            decode(st, FORCED, stop=int(round(f * g.num_nodes)), forced=p.device_of_node)
            decode(st, LA_RULE)
            row[f"prefix{f:g}"] = float(st.finish()[0]) / ref if bool(st.feasible()[0]) else float("inf")
        rows.append(row)
        print(f"{row['pair']:44s} search {row['search']:.3f}, " + ", ".join(
            f"{f:g}: {row[f'prefix{f:g}']:.3f}" for f in PREFIXES), flush=True)
    summary = {k: gm([r[k] for r in rows]) for k in rows[0] if k != "pair"}
    print(", ".join(f"{k} {v:.4f}" for k, v in summary.items()))
    return {"seconds": args.seconds, "summary": summary, "rows": rows}


def small_specs() -> list[dict]:
    """12 small pairs for ``rollout`` (module doc): rollout over ``la_rule`` is O(N^3 D^3)."""
    rng = np.random.default_rng(778)
    graphs = [{"family": f, "num_nodes": int(rng.integers(60, 140)), "seed": int(rng.integers(2**31))}
              for f in ("dataflow", "dataflow", "series_parallel", "transformer_like")]
    return _on_comm_clusters(rng, graphs)


def pi_specs(n: int) -> list[dict]:
    """Small training tasks for ``rollout``'s policy iteration (module doc)."""
    return train_specs(n, seed=4244, families=("dataflow", "dataflow", "series_parallel", "layered",
                                               "transformer_like", "cnn_like"),
                       nodes=(60, 180), devices=(4, 8), prefix="pi")


def rollout_over_la_rule(g, c, topo, span: tuple[float, float] = (0.0, 1.0)) -> tuple[float, bool, np.ndarray]:
    """``(step time, feasible, devices)`` of the fortified rollout over ``la_rule`` (module doc, ``rollout``) on the
    decisions in ``span`` (fractions of the simulator's order; ``la_rule`` makes the others)."""
    from placement_rl.cost.decode import LA_RULE, decode
    from placement_rl.cost.schedule import ScheduleState
    from placement_rl.cost.window import placing_window

    n, nd, w = g.num_nodes, topo.num_devices, placing_window(g.num_nodes)
    lo, hi = int(round(span[0] * n)), int(round(span[1] * n))
    st = ScheduleState(g, c, topo, episodes=1, window=w)
    br = ScheduleState(g, c, topo, episodes=nd, window=w)
    decode(st, LA_RULE, stop=lo)
    best_key, best_dev = (True, float("inf")), None
    for t in range(lo, hi):
        br.branch_from(st)
        br.place(np.arange(nd))  # device k in episode k (one it does not fit on completes infeasible)
        decode(br, LA_RULE)
        ok, fin = br.feasible(), br.finish()
        for k in range(nd):
            if (not bool(ok[k]), float(fin[k])) < best_key:
                best_key, best_dev = (not bool(ok[k]), float(fin[k])), br.devices[k].copy()
        st.place(int(best_dev[st.order[t]]))  # follow the best completed placement seen
    decode(st, LA_RULE)  # the rest (after the span) by the rule
    if best_dev is None or (not bool(st.feasible()[0]), float(st.finish()[0])) < best_key:
        best_key, best_dev = (not bool(st.feasible()[0]), float(st.finish()[0])), st.devices[0].copy()
    return best_key[1], not best_key[0], best_dev


SPANS = ((0.0, 0.25), (0.5, 1.0))  # ``rollout``: the rollout on these decisions only (where its gain lies)


def rollout(args, _tasks) -> dict:
    import dataclasses

    from placement_rl import baselines
    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.agents.constructive_eval import evaluate, warm_kernels
    from placement_rl.agents.constructive_train import ConstructiveTrainer
    from placement_rl.studies.pretrain import build_tasks

    small = build_tasks(small_specs(), workers=1, cache=args.cache)
    rows = []
    for t in small:
        g, c, topo = t.graph, t.costs, t.topology
        ref, _, _ = _la_rule(g, c, topo)
        t0 = time.perf_counter()
        f2, ok2, _ = rollout_over_la_rule(g, c, topo)
        sec = time.perf_counter() - t0
        row = {"pair": t.meta["id"], "nodes": g.num_nodes, "devices": topo.num_devices,
               "rollout_over_la_rule": f2 / ref if ok2 else float("inf"), "rollout_seconds": sec}
        for a, b in SPANS:
            t1 = time.perf_counter()
            fs, oks, _ = rollout_over_la_rule(g, c, topo, (a, b))
            row[f"rollout_{a:g}_{b:g}"] = fs / ref if oks else float("inf")
            row[f"rollout_{a:g}_{b:g}_seconds"] = time.perf_counter() - t1
        for m in ("la_rule_search", "local_search"):
            got = []
            for seed in range(3):
                p = baselines.get(m)(g, c, topo, budget=10**9, seed=args.seed + seed, seconds=sec)
                got.append(float(p.meta["step_time"]) / ref if p.meta.get("feasible") else float("inf"))
            row[f"{m}_median"], row[f"{m}_best"] = float(np.median(got)), min(got)
        rows.append(row)
        print(f"{row['pair']:44s} rollout over la_rule {row['rollout_over_la_rule']:.3f} ({sec:.1f} s); at its "
              f"seconds la_rule_search {row['la_rule_search_median']:.3f}, local_search "
              f"{row['local_search_median']:.3f} (median of 3)", flush=True)
    summary = {k: gm([r[k] for r in rows]) for k in rows[0] if k not in ("pair", "nodes", "devices")}
    print(", ".join(f"{k} {v:.4f}" for k, v in summary.items()), flush=True)

    train = build_tasks(pi_specs(args.pi_tasks), workers=1, cache=args.cache)
    policy, cfg, _ = load_policy(default_checkpoint())
    cfg = dataclasses.replace(cfg, pi_label_every=1, pi_max_labels=10**6, pi_epochs=args.epochs)
    warm_kernels(policy)
    trainer = ConstructiveTrainer(cfg, policy=policy)

    def score(ts) -> float:
        return gm([r.greedy_time / r.task.refs["la_rule"][0] for r in evaluate(policy, ts, samples=0)])

    rounds = [{"round": 0, "small_over_la_rule": score(small), "train_over_la_rule": score(train)}]
    print(f"round 0: small pairs {rounds[0]['small_over_la_rule']:.4f}, training tasks "
          f"{rounds[0]['train_over_la_rule']:.4f} x la_rule", flush=True)
    for rnd in range(1, args.rounds + 1):
        r = trainer.policy_iteration(train, rounds=1)["rounds"][-1]
        rec = {"round": rnd, "agreement": r["agreement"], "labels_depart": r["label_departs_from_student"],
               "small_over_la_rule": score(small), "train_over_la_rule": score(train)}
        rounds.append(rec)
        print(f"round {rnd}: agreement {rec['agreement']:.3f}, labels depart from the student on "
              f"{rec['labels_depart']:.3f}; greedy: small pairs {rec['small_over_la_rule']:.4f}, training tasks "
              f"{rec['train_over_la_rule']:.4f} x la_rule", flush=True)
    return {"summary": summary, "rows": rows, "policy_iteration": {"tasks": len(train), "epochs": args.epochs,
                                                                   "rounds": rounds}}


def _la_rule(g, c, topo, edge_factor=None) -> tuple[float, bool, np.ndarray]:
    from placement_rl.cost.decode import LA_RULE, decode
    from placement_rl.cost.schedule import ScheduleState
    from placement_rl.cost.window import placing_window

    st = ScheduleState(g, c, topo, episodes=1, window=placing_window(g.num_nodes))
    if edge_factor is not None:  # the rule deciding on these edge bytes (the state's own copy of the graph's)
        st._g = (*st._g[:3], np.ascontiguousarray(st._g[3] * edge_factor))
    decode(st, LA_RULE)
    return float(st.finish()[0]), bool(st.feasible()[0]), st.devices[0].copy()


def room(args, tasks) -> dict:
    from placement_rl import baselines
    from placement_rl.cost import resolve_costs
    from placement_rl.errors import PlacementRLError

    rows = []
    for t in tasks:
        g, c, topo = t.graph, t.costs, t.topology
        ref, _, dev = _la_rule(g, c, topo)
        order = np.lexsort((np.arange(topo.num_devices), (c.fwd_time + c.bwd_time).sum(0)))
        ks = {}
        for k in range(1, topo.num_devices + 1):  # la_rule on the k fastest devices
            sub = topo.subset(sorted(order[:k].tolist()))
            try:
                f, ok, _ = _la_rule(g, resolve_costs(g, sub), sub)
            except PlacementRLError:  # the graph does not fit k devices
                f, ok = float("inf"), False
            ks[k] = f / ref if ok else float("inf")
        kb = min(ks, key=ks.get)
        row = {"pair": t.meta["id"], "comm_ratio": float(t.meta.get("comm_ratio", float("nan"))),
               "devices": topo.num_devices, "la_rule_devices": int(len(np.unique(dev))), "best_k": kb,
               "best_k_over_la_rule": ks[kb]}
        for m in ("la_rule_search", "local_search"):
            p = baselines.get(m)(g, c, topo, budget=10**9, seed=args.seed, seconds=args.seconds)
            row[f"{m}_over_la_rule"] = float(p.meta["step_time"]) / ref if p.meta.get("feasible") else float("inf")
            row[f"{m}_devices"] = int(len(np.unique(p.device_of_node)))
        rows.append(row)
        print(f"{row['pair']:44s} comm {row['comm_ratio']:6.2f}: best k {kb} {ks[kb]:.3f}, la_rule_search "
              f"{row['la_rule_search_over_la_rule']:.3f}, local_search {row['local_search_over_la_rule']:.3f}",
              flush=True)
    summary = {k: gm([r[k] for r in rows]) for k in ("best_k_over_la_rule", "la_rule_search_over_la_rule",
                                                      "local_search_over_la_rule")}
    print(", ".join(f"{k} {v:.4f}" for k, v in summary.items()))
    return {"seconds": args.seconds, "summary": summary, "rows": rows}


def clone(args, tasks) -> dict:
    from placement_rl.agents.constructive import imitation_loss, rollout
    from placement_rl.agents.constructive_config import default_checkpoint, load_policy
    from placement_rl.agents.constructive_eval import evaluate, warm_kernels
    from placement_rl.agents.constructive_train import ConstructiveTrainer
    from placement_rl.agents.expert_iteration import search_job
    from placement_rl.cost import Simulator
    from placement_rl.studies.pretrain import build_tasks, split_specs

    train = build_tasks(train_specs(), workers=1, cache=args.cache)
    dev = build_tasks(split_specs("dev"), workers=1, cache=args.cache)
    replay = build_tasks(replay_specs(args.replay), workers=1, cache=args.cache) if args.replay else []
    policy, cfg, _ = load_policy(default_checkpoint())
    warm_kernels(policy)
    trainer = ConstructiveTrainer(cfg, policy=policy)
    trainer._prepare(list(train) + list(tasks) + list(dev) + list(replay))
    replayed = [(t, rollout(None, t, forced=t.refs["la_rule"][2], record=True).trace, None) for t in replay]

    def score(ts) -> float:
        return gm([r.greedy_time / r.task.refs["la_rule"][0] for r in evaluate(policy, ts, samples=0)])

    sims = [Simulator(t.graph, t.costs, t.topology) for t in train]

    def step(i: int, dev_: np.ndarray) -> float:
        r = sims[i].run(dev_)
        return r.step_time if r.feasible else float("inf")

    rng = np.random.default_rng(args.seed)
    best = {i: (t.refs["la_rule"][0], t.refs["la_rule"][2]) for i, t in enumerate(train)}
    keep = (score(tasks), trainer._weights())
    rounds = [{"round": 0, "dev_comm_over_la_rule": keep[0]}]
    print(f"round 0: dev-comm greedy {keep[0]:.4f} x la_rule", flush=True)
    for rnd in range(1, args.rounds + 1):
        policy.eval()
        own = [rollout(policy, t, samples=1, greedy=True, record=True) for t in train]
        data, found, kept = [], [], []
        for i, (t, ro) in enumerate(zip(train, own)):
            starts = [ro.devices[0], t.refs["la_rule"][2], best[i][1]]
            dev_, time_, ok = search_job((t, starts, args.budget, int(rng.integers(2**31))))
            if ok and time_ < best[i][0]:
                best[i] = (time_, dev_)
            found.append(best[i][0] / t.refs["la_rule"][0])
            target = best[i][1].copy()
            if args.target == "minimal":  # revert every change from the student's placement that does not pay
                base, limit = ro.devices[0], best[i][0] * (1 + args.tol)
                diff = np.flatnonzero(target != base)
                for v in rng.permutation(diff).tolist():
                    old, target[v] = target[v], base[v]
                    if step(i, target) > limit:
                        target[v] = old
                kept.append(float((target != base).sum() / max(len(diff), 1)))
            data.append((t, rollout(None, t, forced=target, record=True).trace, None))
            if args.dagger:
                data.append((t, ro.trace, target[ro.trace.nodes][:, None]))
        agree = trainer._distil(data + replayed, args.epochs, args.lr,
                                lambda it: imitation_loss(policy, it[0], it[1], it[2]))
        s = score(tasks)
        rec = {"round": rnd, "searched_over_la_rule": gm(found), "agreement": agree, "dev_comm_over_la_rule": s,
               **({"changes_that_pay": float(np.mean(kept))} if kept else {}),
               **({"dev_over_la_rule": score(dev)} if replay else {})}
        rounds.append(rec)
        print(f"round {rnd}: searched {rec['searched_over_la_rule']:.4f} x la_rule on the training tasks, agreement "
              f"{agree:.3f}, dev-comm greedy {s:.4f} x la_rule", flush=True)
        if s < keep[0]:
            keep = (s, trainer._weights())
    policy.load_state_dict(keep[1])
    out = {"target": args.target, "dagger": args.dagger, "replay": args.replay, "budget": args.budget,
           "epochs": args.epochs, "lr": args.lr,
           "rounds": rounds, "kept_dev_comm_over_la_rule": keep[0], "kept_dev_over_la_rule": score(dev),
           "train_tasks": len(train)}
    print(f"kept: dev-comm {out['kept_dev_comm_over_la_rule']:.4f}, dev {out['kept_dev_over_la_rule']:.4f} x la_rule")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("room", "clone", "links", "edges", "prefix", "rollout"))
    ap.add_argument("--seconds", type=float, default=5.0, help="room, edges, prefix: each search's seconds")
    ap.add_argument("--target", default="search", choices=("search", "minimal"))
    ap.add_argument("--tol", type=float, default=0.002, help="clone --target minimal: a reverted change may cost this")
    ap.add_argument("--dagger", action="store_true")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pi-tasks", type=int, default=32, help="rollout: small training tasks of policy iteration")
    ap.add_argument("--budget", type=int, default=6000, help="clone: simulator calls of one task's search per round")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.0, help="clone: distillation learning rate (0: the recipe's)")
    ap.add_argument("--replay", type=int, default=0, help="clone: la_rule's trajectories on this many other tasks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=None, help="a directory keeping built tasks between runs")
    ap.add_argument("--stem", default=None)
    args = ap.parse_args()

    import torch

    from placement_rl.results import write_result
    from placement_rl.studies.pretrain import build_tasks

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    tasks = [] if args.part == "rollout" else build_tasks(dev_comm_specs(), workers=1, cache=args.cache)
    data = {"room": room, "clone": clone, "links": links, "edges": edges, "prefix": prefix,
            "rollout": rollout}[args.part](args, tasks)
    path = write_result(args.stem or f"probe_learning_comm_{args.part}", data, seconds=time.perf_counter() - t0)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
