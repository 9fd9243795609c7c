"""``placement-rl place search_seconds=S``: the policy-guided search (``agents.policy_search``) from the plan
``place`` found, for ``S`` seconds of wall clock, anytime, beside the searches a user would run instead at the same
seconds (``compare=true``; from ``baselines.side_by_side.FROM_SECONDS`` seconds on a machine with two cores or more,
those run side by side, one process and core each: ``baselines.side_by_side``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placement_rl.cli.common import save_plan
from placement_rl.errors import ConfigError

FOLDER = "policy_search"  # its placement, the anytime trace of every search run and its plot
SAME_SECONDS = ("la_rule_search", "local_search")  # the non-learned searches given the same seconds


def run_searches(policy, graph, costs, topology, task, seconds: float, *, seed: int, compare: bool,
                 phases, start: np.ndarray | None = None) -> dict[str, dict]:
    """``policy_search`` (and with ``compare`` each of ``SAME_SECONDS``) for ``seconds``: per search its step time,
    fit, simulator calls, own seconds, anytime trace ``[seconds, calls, best step time]`` and placement.
    ``start``: the placement ``policy_search`` starts from instead of decoding the policy's greedy one itself
    (``place``'s plan: where it fits, the result is no slower; its row's ``start``: ``plan`` or ``policy``, and
    ``start_time``); the other searches start their own way."""
    from placement_rl.agents.policy_search import policy_search
    from placement_rl.baselines import side_by_side

    def row(p) -> dict:
        m = p.meta
        return {"step_time": float(m["step_time"]), "feasible": bool(m["feasible"]), "sim_calls": int(m["sim_calls"]),
                "seconds": float(m["search_seconds"]),
                "trace": [[float(s), int(c), float(t)] for s, c, t in m.get("trace", [])],
                **({"start_time": float(m["start_time"])} if "start_time" in m else {}),
                "devices": np.asarray(p.device_of_node, dtype=np.int64)}

    def entry(p) -> dict:  # a search that refused the problem (too large for it) is a note, not the end
        return {"refused": str(p)} if isinstance(p, ConfigError) else row(p)

    def ms(r: dict) -> str:
        if "refused" in r:
            return "refused"
        return f"{r['step_time'] * 1e3:.3f} ms" + ("" if r["feasible"] else " (overflows memory)")

    others = SAME_SECONDS if compare else ()
    jobs = [(n, seconds, seed) for n in others]
    found: dict[str, dict] = {}
    if side_by_side.processes_for(jobs) > 1:  # each its own process and core, then policy_search here alone
        with phases(f"{' and '.join(others)} (searches a user would run instead) side by side for {seconds:g} s "
                    f"each") as note:
            got = side_by_side.run(graph, costs, topology, jobs, refusals=True)
            found = {n: entry(p) for n, p in zip(others, got)}
            note.append(", ".join(f"{n} {ms(found[n])}" for n in others))
    out: dict[str, dict] = {}
    for name in ("policy_search", *others):
        if name in found:
            out[name] = found[name]
            continue
        what = ("policy-guided search (the policy's repairs inside simulated annealing)" if name == "policy_search"
                else f"{name} (a search a user would run instead)")
        with phases(f"{what} for {seconds:g} s") as note:
            if name == "policy_search":
                out[name] = {**row(policy_search(policy, graph, costs, topology, seconds=seconds, seed=seed,
                                                 task=task, start=start)),
                             "start": "policy" if start is None else "plan"}
            else:
                out[name] = entry(side_by_side.run(graph, costs, topology, [(name, seconds, seed)], refusals=True)[0])
            note.append(ms(out[name]))
    return out


def done(found: dict[str, dict]) -> dict[str, dict]:
    """The searches of ``run_searches`` that ran (not those that refused the problem)."""
    return {n: r for n, r in found.items() if "refused" not in r}


def write(found: dict[str, dict], graph, topology, out: Path, seconds: float, *, learned: float,
          costs=None) -> list[str]:
    """``policy_search``'s placement, the traces (``trace.csv``: method, seconds, simulator calls, best step time)
    and the anytime plot (``anytime.png``, with the learned plan's step time dashed) in ``out/FOLDER``; returns
    the files written, relative to ``out``."""
    from placement_rl.report import write_csv
    from placement_rl.studies.report import anytime_plot

    found = done(found)
    folder = out / FOLDER
    folder.mkdir(exist_ok=True)
    save_plan(found["policy_search"]["devices"], graph, topology, folder, costs=costs)
    write_csv(folder / "trace.csv", [{"method": name, "seconds": f"{s:.6g}", "sim_calls": c,
                                      "best_step_time_ms": f"{t * 1e3:.6g}"}
                                     for name, r in found.items() for s, c, t in r["trace"]],
              ("method", "seconds", "sim_calls", "best_step_time_ms"))
    anytime_plot({name: r["trace"] for name, r in found.items()}, seconds, folder / "anytime.png",
                 title=f"{graph.name} on {topology.name}", reference=("the learned plan", learned))
    return [f"{FOLDER}/{f}" for f in ("placement.json", "trace.csv", "anytime.png")]


def summary(found: dict[str, dict]) -> str:
    """One line: policy_search's result, and each same-seconds search's."""
    def one(r: dict) -> str:
        return (f"{r['step_time'] * 1e3:.3f} ms" + ("" if r["feasible"] else " (overflows memory)")
                + f" in {r['seconds']:.2f} s, {r['sim_calls']} simulator calls")

    ps = found["policy_search"]
    others = {n: r for n, r in done(found).items() if n != "policy_search"}
    line = f"policy_search (its own row, not the plan): {one(ps)}"
    if ps.get("start") == "plan":
        line += f", from the plan's {ps['start_time'] * 1e3:.3f} ms"
    if others:
        line += "; at the same seconds " + ", ".join(f"{n} {one(r)}" for n, r in others.items())
        best = min((r for r in others.values() if r["feasible"]), key=lambda r: r["step_time"], default=None)
        if best is not None and ps["feasible"]:
            line += f" (policy_search / the best of them {ps['step_time'] / best['step_time']:.3f})"
    refused = {n: r["refused"] for n, r in found.items() if "refused" in r}
    if refused:
        line += "; " + "; ".join(f"{n} refused: {why}" for n, why in refused.items())
    return line


def metrics(found: dict[str, dict]) -> dict[str, dict]:
    """Every search's figures for metrics.json (no placement arrays)."""
    return {name: {k: v for k, v in r.items() if k != "devices"} for name, r in found.items()}
