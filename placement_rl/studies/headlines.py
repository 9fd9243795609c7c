"""The README's headline figures, in words: for each results file (``results/<name>.json``), the rows it gives,
each ``(what, value)`` formatted from the file's figures (``HEADLINES``, in the README's order). The table around
them (provenance, links, commands) is ``studies.render``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable


def _pct(x: float) -> str:
    return f"{x:.1f}%"


def _suite_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    fig = doc["figures"]
    cases = fig["cases"]
    fits = {c for c, v in cases.items() if v.get("single_device_fits")}  # no speed-up over a device it overflows
    op = {c: v["placement"] for c, v in cases.items() if v.get("placement") and c in fits}
    best_op = max(op, key=lambda c: op[c]["speedup"])
    gains = sorted((c for c in op if op[c]["speedup"] > 1.005), key=lambda c: -op[c]["speedup"])
    plans = {c: v["stage_plan"] for c, v in cases.items() if v.get("stage_plan") and c in fits}
    lo, hi = min(plans, key=lambda c: plans[c]["speedup"]), max(plans, key=lambda c: plans[c]["speedup"])
    budget = fig["budget"]
    return [
        (f"op-level placement vs the best single device, benchmark suite ({len(op)} cases where one device fits, "
         f"{budget:,} simulator calls per placer)",
         f"up to {op[best_op]['speedup']:.2f}x ({best_op}: {op[best_op]['ms']:.2f} ms, "
         f"{', '.join(op[best_op]['placers'][:3])}); > 1.00x on {len(gains)} of {len(op)} cases"),
        (f"stage plan (DP / FSDP / DP x PP / TP) vs the best single device ({len(plans)} cases)",
         f"{plans[lo]['speedup']:.2f}x ({lo}) to {plans[hi]['speedup']:.2f}x ({hi}: {plans[hi]['ms']:.2f} ms, "
         f"{', '.join(plans[hi]['placers'][:2])})"),
    ]


def _measured_gpu_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    fig = doc["figures"]
    w = fig["whole"]["calibrated"]
    k = fig["kernels"]
    gemm = " / ".join(_pct(k[o]["mape"]["calibrated"]) for o in ("linear", "bmm", "conv") if o in k)
    return [(f"GPU cost model held out on an {fig['gpu'].replace('_', ' ')} we measured: whole-model MAPE "
             f"(training / inference, {w['training_runs']} / {w['inference_runs']} runs)",
             f"{_pct(w['training_mape'])} / {_pct(w['inference_mape'])} (mean predicted / measured "
             f"{w['training_ratio']:.3f} / {w['inference_ratio']:.3f}); kernels linear / bmm / conv {gemm}")]


def _fidelity_gpu_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    fig = doc["figures"]
    w = fig["whole"]["leave-one-GPU-out"]
    k = fig["kernels"]
    mean = (lambda ops: sum(k[o]["leave-one-GPU-out"] for o in ops) / len(ops))
    return [("GPU cost model on public measurements of five GPUs, leave-one-GPU-out: whole-model MAPE (training / "
             "inference)", f"{_pct(w['training_mape'])} / {_pct(w['inference_mape'])}; kernel tables GEMM "
             f"{_pct(mean(('linear', 'bmm', 'conv')))}, memory-bound {_pct(mean(('ln', 'softmax', 'gelu', 'add')))}; "
             f"worse than the roofline on {len(fig['worse_than_roofline'])} of {fig['tables']} tables")]


def _train_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    head = (f"{f['wall_seconds']:.0f} s (load {f['load_before'][0]:.1f}); best heuristic "
            f"{f['best_heuristic_ms']:.2f} ms, lower bound {f['lower_bound_ms']:.2f} ms")
    same = "; ".join(f"{x['learned_row']} {x['learned_ms']:.2f} ms in {x['seconds']:.2f} s against "
                     + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in x.items() if k.endswith("_ms") and k != "learned_ms")
                     for x in f.get("same_seconds", []))
    return [(f"`placement-rl train` on the default case ({f['graph']} on {f['topology']}): wall seconds; each "
             f"learned row against the searches given its seconds (ms)", head + ("; " + same if same else ""))]


def _train_cold_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    return [("`placement-rl train` on the default case, the first run after an install (numba compiles its kernels "
             "first, outside every row's seconds): wall seconds, of them compiling",
             f"{f['wall_seconds']:.0f} s (load {f['load_before'][0]:.1f}), {f['warm_up_seconds']:.0f} s")]


def _learned_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    cks = f["checkpoints"]
    per = "; ".join(f"{Path(c['checkpoint']).parent.name}/{Path(c['checkpoint']).name}: greedy "
                    f"{c['greedy_over_la_rule']:.4f}, comm-heavy {c['greedy_over_la_rule_comm_heavy']:.4f}, best of "
                    f"16 {c['best16_over_la_rule']:.4f}" for c in cks)
    if len(cks) > 1 and "mean" in f:
        m = f["mean"]
        per = (f"mean of {len(cks)}: greedy {m['greedy_over_la_rule']:.4f}, comm-heavy "
               f"{m['greedy_over_la_rule_comm_heavy']:.4f}, best of 16 {m['best16_over_la_rule']:.4f} ({per})")
    c0 = cks[0]
    extra = []
    if "best16_over_la_rule_links" in c0:  # best of 16 starts with the policy's greedy on slower views of the links
        m = f.get("mean", c0) if len(cks) > 1 else c0
        extra = [(f"best of 16 (its first five: the policy's greedy on links 1.5 / 2 / 0.75 / 3 / 4 x slower) on the "
                  f"`{f['split']}` split over `la_rule_links` (the rule on the same views, best of six) / on the "
                  f"communication-heavy pairs over `la_rule`; `la_rule_links` over `la_rule`",
                  f"{m['best16_over_la_rule_links']:.4f} / {m['best16_over_la_rule_comm_heavy']:.4f}; "
                  f"{m['la_rule_links_over_la_rule']:.4f}" + (f" (mean of {len(cks)})" if len(cks) > 1 else ""))]
    return [(f"zero-shot placement on the `{f['split']}` split ({c0['pairs']} pairs, {c0['comm_heavy_pairs']} "
             f"communication-heavy), ratios to `la_rule` (the argmin of the policy's own lookahead feature), per "
             f"checkpoint", per),
            (f"`la_rule` on the `{f['split']}` split: over `sim_eft` / over the pair's lower bound",
             f"{c0['la_rule_over_sim_eft']:.4f} / {c0['la_rule_over_bound']:.3f}"), *extra]


def _learned_scale_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """``bench_learned.py zeroshot --scale N``: the zero-shot rows where the window cuts the graph."""
    f = doc["figures"]
    cks = f["checkpoints"]
    keys = ("greedy_over_la_rule", "best16_over_la_rule", "greedy_over_best_search_at_its_seconds",
            "best_of_k_over_best_search_at_its_seconds")

    def fmt(c: dict[str, Any]) -> str:
        return (f"greedy {c[keys[0]]:.4f}, best of 16 {c[keys[1]]:.4f}; at their own seconds over the best of "
                f"local_search and la_rule_search: greedy {c[keys[2]]:.4f}, best of 16 {c[keys[3]]:.4f}")

    per = "; ".join(f"{Path(c['checkpoint']).parent.name}/{Path(c['checkpoint']).name}: {fmt(c)}" for c in cks)
    if len(cks) > 1 and "mean" in f:
        per = f"mean of {len(cks)}: {fmt(f['mean'])} ({per})"
    c0 = cks[0]
    words = str(doc.get("command", "")).split()
    seeds = words[words.index("--graph-seeds") + 1:] if "--graph-seeds" in words else []
    seeds = seeds[:next((i for i, w in enumerate(seeds) if w.startswith("--")), len(seeds))]
    which = "dev " if str(doc.get("name", "")).endswith("_dev") else ""
    return [(f"zero-shot placement of {c0['pairs']} {which}graphs of {f['split'].removeprefix('scale')} nodes "
             f"(graph seeds {' '.join(seeds) or '5'}; the policy and `la_rule` decide at a 256-node window), ratios "
             f"to `la_rule` and to the searches given each row's seconds, per checkpoint (pairs where both fit "
             f"memory: {c0.get('both_fit_pairs', c0['pairs'])})", per)]


def _search_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    summ = f["summary"]
    pairs = len({r["pair"] for r in f.get("rows", [])}) or next(iter(summ.values()))["pairs"]
    seeds = next(iter(summ.values())).get("policy_search_over_best_search_per_seed")
    if seeds:  # several graph draws: the split's name says which
        f = {**f, "split": f"{f['split']}, graph seeds {', '.join(seeds)}"}
    vals = ", ".join(f"{float(k):g} s {v['policy_search_over_best_search']:.3f}"
                     + (f" (longest run {v['most_seconds_used']:.2f} x the seconds)"
                        if "most_seconds_used" in v else "")
                     for k, v in summ.items())
    # results that overflow a device's memory are left out of the ratios (the bench counts them)
    bad = "; ".join(f"{float(k):g} s: " + ", ".join(f"{m} {c}" for m, c in v["infeasible"].items() if c)
                    for k, v in summ.items() if any(v.get("infeasible", {}).values()))
    none = sum(v.get("pairs_no_feasible_search", 0) for v in summ.values())
    if bad or none:
        vals += (f" (infeasible results left out: {bad or 'none'}"
                 + (f"; {none} pair-budgets where no search fits memory" if none else "") + ")")
    out = [(f"`policy_search` over the best non-learned search at equal seconds (`{f['split']}`, {pairs} pairs)",
            vals)]
    if all("policy_search_over_best_search_per_seed" in v for v in summ.values()):  # several graph draws
        out.append((f"the same per graph seed (`{f['split']}`; three graphs each): how much it moves with the draw",
                    "; ".join(f"{float(k):g} s " + ", ".join(f"seed {s} {r:.3f}" for s, r in
                                                          v["policy_search_over_best_search_per_seed"].items())
                              for k, v in summ.items())))
    if all("policy_search_over_la_rule_search" in v for v in summ.values()):  # against the strongest single search
        each = ", ".join(f"{float(k):g} s {v['policy_search_over_la_rule_search']:.3f}" for k, v in summ.items())
        out.append((f"`policy_search` over `la_rule_search` alone at equal seconds (`{f['split']}`)", each))
    rule = ", ".join(f"{float(k):g} s {v['la_rule_search_over_la_rule']:.3f}" for k, v in summ.items()
                     if "la_rule_search_over_la_rule" in v)
    if rule:
        out.append((f"`la_rule_search` over `la_rule` (`{f['split']}`): what search adds to the one-pass rule", rule))
    if all("policy_completion_gain" in v for v in summ.values()):  # --ablate: what the learned parts add
        adapt = all(math.isfinite(v.get("adapt_gain", math.nan)) for v in summ.values())  # and the adapted share
        out.append((f"`policy_search` over itself without the policy's moves / with `la_rule` completing its repairs "
                    + ("/ with its repairs' share of the seconds fixed " if adapt else "")
                    + f"(`{f['split']}`; below 1: the policy helps)",
                    ", ".join(f"{float(k):g} s {v['policy_moves_gain']:.3f} / {v['policy_completion_gain']:.3f}"
                              + (f" / {v['adapt_gain']:.3f}" if adapt else "") for k, v in summ.items())))
    return out


def _anneal_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    summ = f["summary"]
    runs = next(iter(summ.values()))["runs"]
    vals = ", ".join(f"{float(k):g} s {v['current_over_former']:.3f} ({v['current_over_la_rule']:.3f} against "
                     f"{v['former_over_la_rule']:.3f} x `la_rule`; the former found nothing in "
                     f"{v['former_found_nothing_frac']:.0%} of the runs, the current in {v['current_found_nothing_frac']:.0%})"
                     for k, v in summ.items())
    return [(f"the annealing every search runs, current settings (region moves, colder start) over the former, from "
             f"`la_rule` at equal seconds (`{f['split']}`, {runs} runs: pairs x seeds)", vals)]


def _bounds_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    summ = doc["figures"]["summary"]
    parts = []
    for name, v in summ.items():
        part = (f"`{name}` ({v['pairs']} pairs): `la_rule` {v['la_rule_over_bound_before']:.3f} -> "
                f"{v['la_rule_over_bound']:.3f}"
                + (f" ({v['pairs_la_rule_fits']} pairs where it fits)" if v["pairs_la_rule_fits"] < v["pairs"] else ""))
        if v.get("best_known_over_bound") is not None:
            part += (f", best known {v['best_known_over_bound_before']:.3f} -> {v['best_known_over_bound']:.3f} "
                     f"({v['pairs_with_best_known']} pairs)")
        part += (f"; tighter on {v['pairs_blocks_tighter']}, `la_rule` within 1% of it on "
                 f"{v['pairs_la_rule_within_1pct']}; at most {v['blocks_seconds_max']:.1f} s")
        parts.append(part)
    return [("the lower bound on op placements with its blocks part (fork-join blocks: serial work on one device "
             "or a transfer) against without it (path, work): `la_rule` and the best placement any search found, "
             "over the bound", "; ".join(parts))]


def _exact_room_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    a = f["summary"]
    fams = ", ".join(f"{k} {v['la_rule_over_optimum']:.3f} / {v['bound_over_optimum']:.3f}"
                     for k, v in a.items() if k != "all")
    a = a["all"]

    def one(key: str) -> str:
        return f"{a[key + '_over_optimum']:.3f} (optimal on {a[key + '_optimal']})"

    best16 = (f", the policy's best of 16 {one('policy_best16')} against `la_rule_links` {one('la_rule_links')}"
              if "policy_best16_over_optimum" in a else "")
    return [(f"small problems solved exactly ({a['problems']}, {a['comm_heavy']} communication-heavy; dev seeds), "
             f"over the optimum: `la_rule`, the policy's greedy, its best of 16, `la_rule_search` "
             f"({f['seconds']:g} s), the lower bound",
             f"`la_rule` {one('la_rule')}, the policy's greedy {one('policy_greedy')}{best16}, `la_rule_search` "
             f"{one('la_rule_search')}, the bound {a['bound_over_optimum']:.3f} (without its blocks part "
             f"{a['bound_without_blocks_over_optimum']:.3f}); the optimum over `la_rule` {a['optimum_over_la_rule']:.3f} "
             f"(no placement does better); per family, `la_rule` and the bound over the optimum: {fams}")]


def _cp_room_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    rows = f["rows"]
    pinned = [r for r in rows if r["best_over_bound"] <= 1.001]
    parts = []
    for name, v in f["summary"].items():
        parts.append(f"{name} ({v['problems']}): the bound {v['bound_over_la_rule']:.3f} x `la_rule` (without cp "
                     f"{v['bound_without_cp_over_la_rule']:.3f}), above 0.97 / 0.94 / 0.92 x it on "
                     f"{v['bound_above_0.97_la_rule']} / {v['bound_above_0.94_la_rule']} / "
                     f"{v['bound_above_0.92_la_rule']}; over the bound `la_rule` {v['la_rule_over_bound']:.3f}, the "
                     f"policy's greedy {v['policy_greedy_over_bound']:.3f}, best of 16 {v['policy_best16_over_bound']:.3f}"
                     f", `la_rule_search` {v['la_rule_search_over_bound']:.3f}, `local_search` "
                     f"{v['local_search_over_bound']:.3f}, the best found {v['best_over_bound']:.3f}")
    pin = ""
    if pinned:
        def geomean(xs: list[float]) -> float:
            return math.exp(sum(math.log(x) for x in xs) / len(xs))

        pin = (f"; the optimum pinned (best found within 0.1% of the bound) on {len(pinned)} of {len(rows)}, where "
               f"it is {geomean([1.0 / r['la_rule_over_bound'] for r in pinned]):.3f} x `la_rule` and the policy's "
               f"greedy {geomean([r['policy_greedy_over_bound'] for r in pinned]):.3f} x it")
    return [(f"medium problems (30-103 nodes) and the lower bound with its cp part (CP-SAT, {f['cp_seconds']:g} s), "
             f"against the rule, the policy and search ({f['seconds']:g} s)", "; ".join(parts) + pin)]


def _cp_sat_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    s = f["summary"]
    parts = []
    for key, label in (("exact_as_is", "as they are"),
                       ("exact_tight", f"devices holding {f['tight']:g} of the optimum's fullest device")):
        v = s.get(key)
        if not v:
            continue
        search = ("" if v["la_rule_search_over_optimum"] is None else
                  f"; `la_rule_search` given the same seconds {v['la_rule_search_over_optimum']:.3f} (optimal on "
                  f"{v['la_rule_search_optimal']}, fits {v['la_rule_search_fits']})")
        parts.append(f"{label} ({v['problems']}): `cp_sat` {v['cp_sat_over_optimum']:.4f} x the optimum, optimal on "
                     f"{v['cp_sat_optimal']} (proved on {v['cp_sat_proved']}), fits {v['cp_sat_fits']}, median "
                     f"{v['cp_sat_seconds_median']:.2f} s (longest {v['cp_sat_seconds_max']:.1f} s){search}")
    m = s.get("medium")
    if m:
        gap = "" if m["best_over_cp_bound"] is None else (
            f"; the better of the two {m['best_over_cp_bound']:.3f} x `cp_sat`'s bound (proved on {m['with_bound']})")
        parts.append(f"medium ({m['pairs']} pairs of 24-60 nodes on 4 GPUs, {f['seconds']:g} s each): `cp_sat` "
                     f"{m['cp_sat_over_la_rule_search']:.3f} x `la_rule_search` at the same seconds, better than its "
                     f"hint on {m['cp_sat_improved']}, the optimum proved on {m['cp_sat_proved']}{gap}")
    return [(f"`cp_sat` (CP-SAT with every device's memory, at most {f['seconds']:g} s): small problems of known "
             "optimum (dev seeds), as they are and memory-tight, and medium ones", "; ".join(parts))]


def _maxload_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    rows = []
    e = f.get("exact_summary")
    if e:
        rows.append(("`placement-rl maxload` on random instances of 6-7 classes (2 accelerators and a CPU core), "
                     "against enumeration",
                     f"the dynamic program equals the best contiguous split on {e['dp_equal']} of {e['instances']}, "
                     f"the search ({f['seconds']:g} s) the best split of any shape on {e['best_equal']} (proved on "
                     f"{e['proved']}); the best contiguous split {e['contiguous_over_any']:.3f} x the best of any "
                     f"shape"))
    z = f.get("zoo_summary")
    if z:
        rows.append((f"`placement-rl maxload` on the zoo's layer and operator graphs ({z['cases']} instances, "
                     "training, `cpu_2gpu` and `8x_v100_dgx1`): max-load ratios",
                     f"best contiguous split over the linearised graph's (PipeDream's space) "
                     f"{z['contiguous_over_linear']:.3f}, over one accelerator {z['contiguous_over_one']:.3f}; "
                     f"best of any shape ({f['seconds']:g} s) over contiguous {z['best_over_contiguous']:.3f}, over "
                     f"the lower bound {z['best_over_bound']:.3f} (proved optimal on {z['proved']}); contiguous "
                     f"optimum proved on {z['contiguous_proved']}, at most {z['ideals_max']} ideals and "
                     f"{z['dp_seconds_max']:.1f} s"))
    lat = f.get("latency_summary")
    if lat:
        rows.append(("`placement-rl maxload --objective latency` (one sample through an inference graph): random "
                     "6-node instances against enumeration; the zoo's layer graphs (and operator graphs) on `cpu_2gpu`",
                     f"equal on {lat['random_equal']} of {lat['random']} (proved on {lat['random_proved']}); zoo "
                     f"({lat['zoo']}): {lat['zoo_over_maxload_split']:.3f} x the max-load split's latency, "
                     f"{lat['zoo_over_all_cpu']:.3f} x every node on a CPU, "
                     + (f"{lat['zoo_over_bound']:.3f} x the bound" if lat["zoo_over_bound"] else "no bound")
                     + f" (proved on {lat['zoo_proved']})"
                     + (f"; operator graphs ({lat['ops']}): {lat['ops_over_maxload_split']:.3f} x the max-load "
                        f"split's latency, {lat['ops_over_bound']:.3f} x the bound (proved on {lat['ops_proved']})"
                        if lat.get("ops") else "")))
    return rows


def _tight_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    f = doc["figures"]
    s = f["summary"]
    seed0 = f.get("first_seed", 3100)
    names = [m for m in s["fits"] if m != "la_rule"]
    value = (f"fit memory: `la_rule` {s['fits']['la_rule']}, "
             + ", ".join(f"`{m}` {s['fits'][m]}" for m in names) + f" of {s['pairs']}; over `local_search` where both "
             "fit: " + ", ".join(f"`{m}` {s[f'{m}_over_local_search']:.3f}" for m in names if m != "local_search"))
    b = s.get("before")
    if b:
        value += (f"; against the same pairs at {b['commit']} (before `memory.fit`): fit "
                  + ", ".join(f"{b['fits_before'][m]} -> {b['fits_after'][m]}" for m in names)
                  + ", step time where both fit " + ", ".join(f"{b[f'{m}_over_before']:.3f}" for m in names)
                  + " x then (same order)")
    return [(f"searches at {f['seconds']:g} s on memory-tight clusters ({s['pairs']} pairs, {f['nodes']}-node graphs "
             f"of seeds {seed0}-{seed0 + s['pairs'] // 2 - 1}, devices holding 1 / 0.7 or 1 / 0.85 of what the graph "
             "pins)", value)]


# results file -> the rows it gives, in the README's order
HEADLINES: dict[str, Callable[[dict[str, Any]], list[tuple[str, str]]]] = {
    "evaluate_suite": _suite_rows,
    "fidelity_h200": _measured_gpu_rows,
    "fidelity_h100": _measured_gpu_rows,
    "fidelity_gpu": _fidelity_gpu_rows,
    "train_default": _train_rows,
    "train_cold": _train_cold_rows,
    "learned_test": _learned_rows,
    "learned_dev": _learned_rows,
    "learned_scale2000": _learned_scale_rows,
    "learned_scale2000_dev": _learned_scale_rows,
    "search_test": _search_rows,
    "search_test_60s": _search_rows,
    "search_dev": _search_rows,
    "search_scale2000": _search_rows,
    "search_scale2000_seeds": _search_rows,
    "search_scale2000_paced": _search_rows,
    "search_scale2000_60s": _search_rows,
    "anneal_dev": _anneal_rows,
    "bounds": _bounds_rows,
    "probe_exact_room": _exact_room_rows,
    "probe_cp_room": _cp_room_rows,
    "cp_sat": _cp_sat_rows,
    "maxload": _maxload_rows,
    "tight_memory_dev": _tight_rows,
    "tight_memory": _tight_rows,
}


__all__ = ["HEADLINES"]
