"""Is the learned placer worth its name? Zero-shot rows against the rules, and policy-guided search against search.

    python scripts/bench_learned.py zeroshot --split dev --runs outputs/train/<run0> <run1> <run2>
    python scripts/bench_learned.py zeroshot --split test --runs ...        # the fresh test split: final figures only
    python scripts/bench_learned.py search --split dev --seconds 0.5 2 10 --pairs 8
    python scripts/bench_learned.py search --scale 2000 --seconds 0.5 2 10 60
    python scripts/bench_learned.py zeroshot --scale 2000 --graph-seeds 5 8 9 --runs ...   # where the window cuts
    python scripts/bench_learned.py resummarise results/search_test.json   # the summary again from the rows

``zeroshot``: per pair of the split (``placement_rl.studies.splits``), the lower bound (``baselines.bounds``: the
path and work bounds), the one-pass rules ``sim_eft``, ``eft_rollout`` and ``la_rule`` (the argmin of the policy's
own ``la_step`` feature), and each checkpoint's greedy and best-of-16 placements, with calls and seconds. Summary:
geometric means of greedy / ``la_rule`` and best of 16 / ``la_rule`` per checkpoint and their mean over
checkpoints, on all pairs and on the communication-heavy ones (``comm_ratio`` >= 1: a typical edge's transfer takes
longer than its producer's compute), and greedy / ``sim_eft``, ``eft_rollout``. ``--runs`` takes run folders (their
``checkpoint.pt``) or checkpoint files; default: the shipped checkpoint. With ``--scale N`` (below) the pairs are
those graphs, where above ``FULL_WINDOW`` nodes the policy and ``la_rule`` decide at the window ``POLICY_WINDOW``
(the rule's ``la_step`` no longer the completed step), and each learned row is also set against ``local_search`` and
``la_rule_search`` given its own seconds (``greedy_over_best_search_at_its_seconds``; ratios over the pairs where
both placements fit memory, ``both_fit_pairs`` of them for greedy and ``la_rule``).

``search``: per pair and wall-clock budget, ``policy_search`` (the first checkpoint's policy as the proposal,
``agents.policy_search``) against the non-learned searches at the same seconds: ``local_search``,
``eft_rollout_search`` and ``la_rule_search`` (annealing from ``la_rule``); the ratio of ``policy_search`` to the
best of them per pair, its geometric mean per budget, the pair's lower bound beside every row, and an anytime plot
(best step time over seconds, per method, one pair per panel). ``--ablate`` adds ``policy_search`` without the
policy's moves (the same starts, annealing only): ``policy_moves_gain`` is what the policy's proposals add; and
``policy_search`` whose repairs ``la_rule`` completes instead of the policy's greedy: ``policy_completion_gain`` is
what the learned completion adds over the rule's (both ratios: below 1, the policy helps); and ``policy_search``
with the repairs' share of the seconds fixed: ``adapt_gain`` is what adapting it adds. ``--scale N``: instead of a
split, a layered graph on 2 x 4 V100 (InfiniBand), a dataflow graph on a DGX-1 and a transformer-like graph on 8
A100 (NVSwitch; on 4 V100 it does not fit memory and the task builder drops it), N nodes each, seed 5
(``--graph-seeds 5 8 9``: three graphs per seed, and the summary per seed). Every ratio of the summary is over the
pairs where both of its placements fit memory (``search_summary``; the infeasible ones counted); ``resummarise``
recomputes the summary of written results from their rows. ``--milp-seconds S`` (either part): each pair's lower
bound also takes the ``milp`` part (``baselines.bounds``: the transfers a spread placement waits on), S seconds a pair.

Each part writes ``results/learned_<split>.json`` / ``results/search_<split>.json`` (figures with provenance,
``placement_rl.results``; each anytime trace there thinned to ``TRACE_POINTS`` log-spaced improvements, the plot drawn
from whole ones) and a markdown table under ``docs/`` (``--out``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

SEARCHES = ("local_search", "eft_rollout_search", "la_rule_search")


def gm(x) -> float:
    x = [v for v in x if np.isfinite(v)]
    return float(np.exp(np.mean(np.log(x)))) if x else float("nan")


TRACE_POINTS = 100  # an anytime trace in the results file: at most this many points (the plot reads them all)


def thin_trace(trace: list, points: int = TRACE_POINTS) -> list:
    """``trace`` ([seconds, calls, best step time] at every improvement) with at most ``points`` entries: the first,
    the last, and the last improvement in each of ``points - 2`` log-spaced intervals of seconds (the best step time
    over seconds at that resolution, its end exact)."""
    if len(trace) <= points:
        return trace
    t = np.array([max(float(e[0]), 1e-9) for e in trace])
    edges = np.geomspace(t[0], t[-1] * (1 + 1e-12), points - 1)
    last = {int(np.searchsorted(edges, x, side="right")): i for i, x in enumerate(t)}  # the last entry per interval
    keep = sorted({0, len(trace) - 1, *last.values()})
    return [trace[i] for i in keep]


SCALE_SEED = 5  # the 2,000-node graphs' draw (dev probes read seeds 6 and 7: scripts/probe_windows.py)


def load_tasks(split: str, scale: int, cache: str | None, workers: int, graph_seeds=(SCALE_SEED,)):
    from placement_rl.studies.pretrain import build_tasks, split_specs

    if scale:
        specs = [{"graph": {"family": fam, "num_nodes": scale, "seed": s}, "topology": t,
                  "id": f"{fam}-{scale}{'' if s == SCALE_SEED else f's{s}'}@{t}"}
                 for s in graph_seeds
                 for fam, t in (("layered", "2x4_v100_ib"), ("dataflow", "8x_v100_dgx1"),
                                ("transformer_like", "8x_a100_nvswitch"))]
        tasks = build_tasks(specs, workers=workers, cache=cache)
        seed_of = {sp["id"]: sp["graph"]["seed"] for sp in specs}
        for t in tasks:
            t.meta["graph_seed"] = seed_of[t.meta["id"]]
        return tasks
    return build_tasks(split_specs(split), workers=workers, cache=cache)


def checkpoints(runs: list[str]) -> list[Path]:
    from placement_rl.agents.constructive_config import default_checkpoint

    if not runs:
        return [default_checkpoint()]
    return [Path(r) / "checkpoint.pt" if Path(r).is_dir() else Path(r) for r in runs]


def zeroshot(args) -> dict:
    import torch

    from placement_rl.agents.constructive_config import load_policy
    from placement_rl.agents.constructive_eval import warm_kernels
    from placement_rl.agents.scaleout import evaluate_tasks
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.studies.pretrain import result_rows

    torch.set_num_threads(1)
    tasks = load_tasks(args.split, args.scale, args.cache, args.workers, args.graph_seeds)
    bounds = {t.meta["id"]: lower_bound(t.graph, t.costs, t.topology, milp_seconds=args.milp_seconds) for t in tasks}
    # the rule on slower views of the links too (baselines.eft.LINK_SCALES): the bar of the best-of-16 row, whose
    # first placements are the policy's greedy on the same views
    from placement_rl import baselines

    links = {t.meta["id"]: baselines.get("la_rule_links")(t.graph, t.costs, t.topology, budget=10**12, seed=0)
             for t in tasks}
    per_ckpt = []
    rows_all = []
    for i, path in enumerate(checkpoints(args.runs)):
        policy, _, _ = load_policy(path)
        warm_kernels(policy)
        t0 = time.perf_counter()
        rows = result_rows(evaluate_tasks(policy, tasks, samples=16, seed=args.seed))
        for r, t in zip(rows, tasks):
            ref = r["best_one_pass_ms"] / 1e3
            r["bound"] = bounds[t.meta["id"]].value / ref
            r["comm_ratio"] = float(t.meta.get("comm_ratio", float("nan")))
            p = links[t.meta["id"]]
            r["la_rule_links"] = float(p.meta["step_time"]) / ref if p.meta["feasible"] else float("inf")
            r["checkpoint"] = i
            if args.scale:  # the searches a user would run instead, each given a learned row's seconds
                _same_seconds(r, t, ref, args.seed)
        summ = {"checkpoint": str(path), "seconds": time.perf_counter() - t0,
                **zeroshot_summary(rows, bool(args.scale))}
        per_ckpt.append(summ)
        rows_all += rows
        print(f"{path}: " + ", ".join(f"{k} {v:.4f}" for k, v in summ.items() if isinstance(v, float)), flush=True)
    split = args.split if not args.scale else f"scale{args.scale}"
    return {"split": split, "checkpoints": per_ckpt, **mean_and_worst(per_ckpt), "rows": rows_all}


def zeroshot_summary(rows: list[dict], scale: bool = False) -> dict:
    """One checkpoint's geometric means over its rows (each ratio over the pairs where both of its placements fit
    memory: a row's NaN or inf is left out)."""
    def ratio(a: float, b: float) -> float:
        return a / b if np.isfinite(a) and np.isfinite(b) else float("nan")

    heavy = [r for r in rows if r["comm_ratio"] >= 1.0]
    summ = {"pairs": len(rows), "comm_heavy_pairs": len(heavy),
            "greedy_over_la_rule": gm([ratio(r["greedy"], r["la_rule"]) for r in rows]),
            "best16_over_la_rule": gm([ratio(r["best_of_k"], r["la_rule"]) for r in rows]),
            "greedy_over_la_rule_comm_heavy": gm([ratio(r["greedy"], r["la_rule"]) for r in heavy]),
            "best16_over_la_rule_comm_heavy": gm([ratio(r["best_of_k"], r["la_rule"]) for r in heavy]),
            "best16_over_la_rule_links": gm([ratio(r["best_of_k"], r["la_rule_links"]) for r in rows]),
            "la_rule_links_over_la_rule": gm([ratio(r["la_rule_links"], r["la_rule"]) for r in rows]),
            "greedy_over_sim_eft": gm([ratio(r["greedy"], r["sim_eft"]) for r in rows]),
            "greedy_over_eft_rollout": gm([ratio(r["greedy"], r["eft_rollout"]) for r in rows]),
            "la_rule_over_sim_eft": gm([ratio(r["la_rule"], r["sim_eft"]) for r in rows]),
            "la_rule_over_bound": gm([ratio(r["la_rule"], r["bound"]) for r in rows]),
            "greedy_le_la_rule_frac": float(np.mean([r["greedy"] <= r["la_rule"] + 1e-9 for r in rows]))}
    if scale:
        summ["both_fit_pairs"] = int(sum(np.isfinite(r["greedy"]) and np.isfinite(r["la_rule"]) for r in rows))
        for row in ("greedy", "best_of_k"):
            summ[f"{row}_over_best_search_at_its_seconds"] = gm(
                [ratio(r[row], min(r[f"{n}_at_{row}"] for n in SAME_SECONDS)) for r in rows])
    return summ


def mean_and_worst(per_ckpt: list[dict]) -> dict:
    keys = [k for k in per_ckpt[0] if k.endswith(("la_rule", "comm_heavy", "sim_eft", "eft_rollout", "frac",
                                                  "la_rule_links", "its_seconds"))]
    return {"mean": {k: float(np.mean([s[k] for s in per_ckpt])) for k in keys},
            "worst": {k: float(np.max([s[k] for s in per_ckpt])) for k in keys}}


SAME_SECONDS = ("local_search", "la_rule_search")  # --scale: run at the greedy's and the best of 16's seconds


def _same_seconds(row: dict, task, ref: float, seed: int) -> None:
    """``<search>_at_greedy`` / ``<search>_at_best_of_k`` (ratios to ``ref``; NaN where it overflows memory) and
    ``<search>_at_<row>_s`` of each of ``SAME_SECONDS`` given the learned row's own seconds, here, one at a time."""
    from placement_rl import baselines

    for learned in ("greedy", "best_of_k"):
        sec = float(row[f"{learned}_s"])
        for name in SAME_SECONDS:
            p = baselines.get(name)(task.graph, task.costs, task.topology, budget=10**12, seed=seed, seconds=sec)
            row[f"{name}_at_{learned}"] = float(p.meta["step_time"]) / ref if p.meta["feasible"] else float("nan")
            row[f"{name}_at_{learned}_s"] = float(p.meta["search_seconds"])


def search(args) -> dict:
    import torch

    from placement_rl import baselines
    from placement_rl.agents.constructive_config import load_policy
    from placement_rl.agents.constructive_eval import warm_kernels
    from placement_rl.agents.policy_search import policy_search
    from placement_rl.baselines.bounds import lower_bound

    torch.set_num_threads(1)
    tasks = load_tasks(args.split, args.scale, args.cache, args.workers, args.graph_seeds)
    if args.pairs:
        tasks = tasks[:: max(1, len(tasks) // args.pairs)][: args.pairs]
    policy, _, _ = load_policy(checkpoints(args.runs)[0])
    warm_kernels(policy)
    rows, curves = [], {}
    for t in tasks:
        g, c, topo = t.graph, t.costs, t.topology
        b = lower_bound(g, c, topo, milp_seconds=args.milp_seconds).value
        rule, rule_ok = t.refs["la_rule"][:2] if "la_rule" in t.refs else (float("nan"), False)
        for sec in args.seconds:
            row = {"pair": t.meta["id"], "graph_seed": int(t.meta.get("graph_seed", -1)),
                   "nodes": g.num_nodes, "devices": topo.num_devices, "seconds": sec,
                   "bound_ms": b * 1e3, "la_rule_ms": rule * 1e3, "la_rule_feasible": bool(rule_ok),
                   "comm_ratio": float(t.meta.get("comm_ratio", float("nan")))}
            for name in SEARCHES:
                p = baselines.get(name)(g, c, topo, budget=10**12, seed=args.seed, seconds=sec)
                row[f"{name}_ms"] = float(p.meta["step_time"]) * 1e3
                row[f"{name}_calls"] = int(p.meta["sim_calls"])
                row[f"{name}_s"] = float(p.meta["search_seconds"])  # its wall seconds (a start may overrun)
                row[f"{name}_feasible"] = bool(p.meta["feasible"])
                curves[(t.meta["id"], sec, name)] = p.meta["trace"]
            p = policy_search(policy, g, c, topo, seconds=sec, seed=args.seed, task=t)
            row["policy_search_ms"] = float(p.meta["step_time"]) * 1e3
            row["policy_search_calls"] = int(p.meta["sim_calls"])
            row["policy_search_s"] = float(p.meta["search_seconds"])
            row["policy_search_feasible"] = bool(p.meta["feasible"])
            curves[(t.meta["id"], sec, "policy_search")] = p.meta["trace"]
            if args.ablate:  # the same search from the same starts without the policy's moves: what they add
                p = policy_search(policy, g, c, topo, seconds=sec, seed=args.seed, task=t, anneal_share=1.0)
                row["policy_search_no_policy_moves_ms"] = float(p.meta["step_time"]) * 1e3
                row["policy_moves_gain"] = row["policy_search_ms"] / row["policy_search_no_policy_moves_ms"]
                # and with the policy's repairs completed by la_rule instead of its greedy: what the learned
                # completion adds over the rule's
                p = policy_search(policy, g, c, topo, seconds=sec, seed=args.seed, task=t, completion="la_rule")
                row["policy_search_rule_completion_ms"] = float(p.meta["step_time"]) * 1e3
                row["policy_completion_gain"] = row["policy_search_ms"] / row["policy_search_rule_completion_ms"]
                # and with the repairs' share of the seconds fixed (1 - ANNEAL_SHARE): what adapting it adds
                p = policy_search(policy, g, c, topo, seconds=sec, seed=args.seed, task=t, adapt=False)
                row["policy_search_fixed_share_ms"] = float(p.meta["step_time"]) * 1e3
                row["adapt_gain"] = (row["policy_search_ms"] / row["policy_search_fixed_share_ms"]
                                     if p.meta["feasible"] and row["policy_search_feasible"] else float("nan"))
            # the best feasible search (an infeasible placement's step time ignores the memory it overflows)
            ok = [n for n in SEARCHES if row[f"{n}_feasible"]]
            best = min((row[f"{n}_ms"] for n in ok), default=float("nan"))
            row["best_search"] = min(ok, key=lambda n: row[f"{n}_ms"]) if ok else None
            row["policy_search_over_best_search"] = (row["policy_search_ms"] / best if row["policy_search_feasible"]
                                                     else float("inf")) if ok else float("nan")
            feas = [row[f"{n}_ms"] for n in (*SEARCHES, "policy_search") if row[f"{n}_feasible"]]
            row["best_over_bound"] = min(feas) / row["bound_ms"] if feas else float("nan")
            rows.append(row)
            print(f"{row['pair']:42s} {sec:5g} s: policy_search / best feasible search ({row['best_search']}) "
                  f"{row['policy_search_over_best_search']:.4f}, best / bound {row['best_over_bound']:.3f}",
                  flush=True)
    summary = search_summary(rows, args.seconds, args.graph_seeds if args.scale else (), args.ablate)
    _plot(curves, args)
    return {"split": args.split if not args.scale else f"scale{args.scale}", "summary": summary, "rows": rows,
            "curves": [{"pair": k[0], "seconds": k[1], "method": k[2], "trace": thin_trace(v)}
                       for k, v in curves.items()]}


def search_summary(rows: list[dict], seconds, graph_seeds=(), ablate: bool = False) -> dict:
    """The summary per budget of ``search``'s rows: every ratio over the pairs where both of its placements fit
    memory (an infeasible placement's step time ignores the memory it overflows), the infeasible ones counted."""
    def ok(r: dict, n: str) -> bool:
        return bool(r.get(f"{n}_feasible", True))

    methods = (*SEARCHES, "policy_search")
    summary = {}
    for sec in seconds:
        sel = [r for r in rows if r["seconds"] == sec and r["best_search"] is not None]  # pairs some search fits
        summary[str(sec)] = {
            "pairs_no_feasible_search": sum(r["seconds"] == sec and r["best_search"] is None for r in rows),
            "infeasible": {n: sum(not ok(r, n) for r in sel) for n in methods},
            "pairs": len(sel), "policy_search_over_best_search": gm([r["policy_search_over_best_search"] for r in sel]),
            "policy_search_le_best_frac": float(np.mean([r["policy_search_over_best_search"] <= 1 + 1e-9
                                                         for r in sel])),
            **{f"{n}_over_la_rule": gm([r[f"{n}_ms"] / r["la_rule_ms"] for r in sel if ok(r, n) and ok(r, "la_rule")])
               for n in methods},
            # against each search alone: the per-pair best of three runs is a minimum of three draws (biased low)
            **{f"policy_search_over_{n}": gm([r["policy_search_ms"] / r[f"{n}_ms"] for r in sel
                                              if ok(r, n) and ok(r, "policy_search")]) for n in SEARCHES},
            "best_over_bound": gm([r["best_over_bound"] for r in sel]),
            # per graph seed (--scale with several --graph-seeds): how much the figure moves with the draw
            **({"policy_search_over_best_search_per_seed": {
                str(s): gm([r["policy_search_over_best_search"] for r in sel if r["graph_seed"] == s])
                for s in graph_seeds}} if len(graph_seeds) > 1 else {}),
            # the longest any method ran over these seconds, as a multiple of them (equal seconds: close to 1)
            "most_seconds_used": max(r[f"{n}_s"] for r in sel for n in methods) / sec,
            **({k: gm([r[k] for r in sel if k in r and np.isfinite(r[k])])
                for k in ("policy_moves_gain", "policy_completion_gain", "adapt_gain")} if ablate else {})}
    return summary


def resummarise(args) -> None:
    """Recompute the summary of written results from their rows (``search_summary``, the rows' missing
    ``la_rule_feasible`` filled from the tasks of the run's own command; ``zeroshot_summary`` per checkpoint); the
    measurement's provenance is kept and ``summary_recomputed`` says when and at which commit."""
    import json
    import shlex

    for path in args.files:
        data = json.loads(Path(path).read_text())
        run = parser().parse_args(shlex.split(data["command"])[1:])
        fig = data["figures"]
        if run.part == "zeroshot":  # each checkpoint's summary from its rows, then their mean and worst
            for i, c in enumerate(fig["checkpoints"]):
                keep = {k: c[k] for k in ("checkpoint", "seconds")}
                fig["checkpoints"][i] = {**keep, **zeroshot_summary([r for r in fig["rows"] if r["checkpoint"] == i],
                                                                    bool(run.scale))}
            fig.update(mean_and_worst(fig["checkpoints"]))
            _rewrite(path, data, run, "zeroshot")
            continue
        if any("la_rule_feasible" not in r for r in fig["rows"]):
            tasks = load_tasks(run.split, run.scale, args.cache or run.cache, 1, run.graph_seeds)
            fits = {t.meta["id"]: bool(t.refs["la_rule"][1]) if "la_rule" in t.refs else False for t in tasks}
            for r in fig["rows"]:
                r.setdefault("la_rule_feasible", fits[r["pair"]])
        fig["summary"] = search_summary(fig["rows"], run.seconds, run.graph_seeds if run.scale else (), run.ablate)
        _rewrite(path, data, run, "search")


def _rewrite(path: str, data: dict, run, kind: str) -> None:
    """Write ``data`` back with ``summary_recomputed`` (when, at which commit), and its markdown table."""
    import json

    from placement_rl.graph.io import atomic_write_text
    from placement_rl.results import git_state

    commit, dirty = git_state()
    data["summary_recomputed"] = (f"{time.strftime('%Y-%m-%d', time.gmtime())} at {str(commit)[:10]}"
                                  f"{' (dirty)' if dirty else ''}: every ratio over the pairs where "
                                  "both of its placements fit memory (bench_learned.py resummarise); rows and "
                                  "curves as measured")
    atomic_write_text(Path(path), json.dumps(data, indent=1, default=float) + "\n")
    md = Path(run.out) / f"{Path(path).stem}.md"
    atomic_write_text(md, _markdown(kind, data["figures"]))
    print(f"rewrote {path}'s summary and {md}")


def _plot(curves: dict, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from placement_rl.studies.report import draw_anytime

    top = max(args.seconds)
    pairs = sorted({k[0] for k in curves})[:8]
    if not pairs:
        return
    fig, axes = plt.subplots(1, len(pairs), figsize=(3.2 * len(pairs), 3), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        draw_anytime(ax, {name: tr for (p, sec, name), tr in curves.items() if p == pair and sec == top}, top)
        ax.set_title(pair, fontsize=7)
    axes[0][0].set_ylabel("best step time (ms)")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    stem = args.stem or f"search_{args.split if not args.scale else f'scale{args.scale}'}"
    out = Path(args.out) / f"{stem}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def _markdown(kind: str, data: dict) -> str:
    from placement_rl.report import markdown_table

    if kind == "zeroshot":
        cols = ("pair", "checkpoint", "nodes", "devices", "comm_ratio", "bound", "sim_eft", "eft_rollout", "la_rule",
                "greedy", "best_of_k", "greedy_s", "la_rule_s")
        if data["split"].startswith("scale"):
            cols += tuple(f"{n}_at_{r}" for r in ("greedy", "best_of_k") for n in SAME_SECONDS) + ("best_of_k_s",)
        head = "\n".join(f"* {k}: {v:.4f} (worst checkpoint {data['worst'][k]:.4f})" for k, v in data["mean"].items())
        return (f"# Zero-shot placement on the `{data['split']}` split\n\nRatios to the best one-pass heuristic of "
                f"each pair (HEFT, m-ETF, m-SCT, METIS); `bound` is the pair's lower bound on the same scale. "
                f"Mean over {len(data['checkpoints'])} checkpoint(s):\n\n{head}\n\n"
                + markdown_table(data["rows"], cols, cols))
    cols = ("pair", "seconds", "comm_ratio", "bound_ms", "la_rule_ms", "local_search_ms", "eft_rollout_search_ms",
            "la_rule_search_ms", "policy_search_ms", "policy_search_over_best_search")
    head = "\n".join(f"* {s} s: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in d.items()) for s, d in data["summary"].items())
    return (f"# Policy-guided search against search at equal seconds (`{data['split']}`)\n\n{head}\n\n"
            + markdown_table(data["rows"], cols, cols))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("zeroshot", "search", "resummarise"))
    ap.add_argument("files", nargs="*", help="resummarise: results/search_*.json files")
    ap.add_argument("--split", default="dev", choices=("dev", "test2024", "test"))
    ap.add_argument("--runs", nargs="*", default=[])
    ap.add_argument("--seconds", nargs="+", type=float, default=[0.5, 2.0, 10.0])
    ap.add_argument("--pairs", type=int, default=0, help="search: this many pairs of the split, evenly spread")
    ap.add_argument("--scale", type=int, default=0,
                    help="three synthetic graphs of this many nodes per graph seed instead of a split (zeroshot: with "
                         "local_search and la_rule_search at each learned row's seconds)")
    ap.add_argument("--graph-seeds", nargs="+", type=int, default=[5],
                    help="--scale: the graphs' seeds (three graphs each; default 5)")
    ap.add_argument("--cache", default=None, help="a directory keeping built tasks between runs")
    ap.add_argument("--workers", default="1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ablate", action="store_true",
                    help="search: also policy_search without the policy's moves (same starts, annealing only) "
                         "and with la_rule completing its repairs")
    ap.add_argument("--milp-seconds", type=float, default=0.0,
                    help="also the milp part of each pair's lower bound, this many seconds a pair (baselines.bounds)")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--stem", default=None, help="result name (default: learned_<split> / search_<split>)")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.part == "resummarise":
        resummarise(args)
        return
    args.workers = int(args.workers) if args.workers.isdigit() else args.workers

    from placement_rl.graph.io import atomic_write_text
    from placement_rl.results import write_result

    t0 = time.perf_counter()
    data = zeroshot(args) if args.part == "zeroshot" else search(args)
    split = data["split"]
    stem = args.stem or (f"learned_{split}" if args.part == "zeroshot" else f"search_{split}")
    path = write_result(stem, data, seconds=time.perf_counter() - t0)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out) / f"{stem}.md", _markdown(args.part, data))
    print(f"wrote {path} and {Path(args.out) / f'{stem}.md'}")


if __name__ == "__main__":
    main()
