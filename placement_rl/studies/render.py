"""Documents rendered from ``results/*.json`` (``placement_rl.results``): the README's headline figure table and
``docs/results.md``, each between markers, so that a printed figure is always a value of a results file.

What each results file's headline rows say is ``studies.headlines``. ``suite_table(folder)`` is
docs/evaluate_suite.md's summary table (``suite_rows_table``: its other two), ``recompute_table(folder)``
docs/tensor_parallel.md's recomputation figures. ``headline_rows(folder)`` builds one row per headline figure:
what it is, its value (formatted from the JSON), when and on what machine it was measured (the file's
provenance), and links to the JSON and the command that made it. ``render_block(text, name, body)`` replaces what lies between ``<!-- name:begin -->`` and ``<!-- name:end -->``;
``render_all(root, check=...)`` renders (or, with ``check``, compares) every document. ``scripts/render.py`` is
the command; ``tests/test_results.py`` fails when a document differs from its data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement_rl.errors import PlacementRLError
from placement_rl.studies.headlines import HEADLINES

README_BLOCK = "figures"
DOCS_BLOCK = "results"


class RenderError(PlacementRLError):
    """A document lacks its markers, or a results file lacks a figure a row reads."""


@dataclass(frozen=True)
class Row:
    what: str
    value: str
    result: str  # results/<result>.json
    command: str
    measured: str


def _load(folder: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(folder.glob("*.json")):
        try:
            out[p.stem] = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise RenderError(f"{p}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    return out


def measured_on(doc: dict[str, Any]) -> str:
    """``2026-11-28, AMD EPYC 7B13 (2 cores), code 1a2b3c4``: the date, machine and commit of a results file's
    provenance (``uncommitted tree`` when tracked files differed from the commit)."""
    prov = doc.get("provenance", {})
    date = str(prov.get("date", "?")).split(" ")[0]
    cpu = str(prov.get("cpu", "?"))
    commit = str(prov.get("commit", "?"))[:7]
    return (f"{date}, {cpu} ({prov.get('cores', '?')} cores), code {commit}"
            + (" + uncommitted changes" if prov.get("dirty") else ""))


def headline_rows(folder: Path) -> list[Row]:
    docs = _load(folder)
    rows = []
    for name, make in HEADLINES.items():
        if name not in docs:
            continue
        try:
            made = make(docs[name])
        except (KeyError, TypeError, ValueError) as exc:
            raise RenderError(f"{folder / name}.json: no figure {exc} (run its command again)") from None
        rows += [Row(what, value, name, str(docs[name].get("command", "?")), measured_on(docs[name]))
                 for what, value in made]
    return rows


def readme_table(rows: list[Row], results_link: str = "results") -> str:
    lines = ["| figure | value | measured | data / command |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.what} | {r.value} | {r.measured} | [{r.result}.json]({results_link}/{r.result}.json): "
                     f"`{r.command}` |")
    return "\n".join(lines)


def _flatten(x: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(x, dict):
        return [kv for k, v in x.items() for kv in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(x, list) and not all(isinstance(v, (str, int, float)) for v in x):
        return [kv for i, v in enumerate(x) for kv in _flatten(v, f"{prefix}[{i}]")]
    if isinstance(x, float):
        return [(prefix, "null" if not math.isfinite(x) else f"{x:g}")]
    if isinstance(x, list):
        return [(prefix, ", ".join(str(v) for v in x))]
    return [(prefix, "null" if x is None else str(x))]


# anytime traces (thousands of points each, plotted beside their tables) and whole markdown tables a benchmark
# recorded (rendered into their own page: the suite's in docs/evaluate_suite.md)
PAGE_SKIPS = ("curves", "tables")


def results_page(folder: Path, results_link: str = "../results") -> str:
    """Every results file the headline table reads (``HEADLINES``): its command, provenance and figures, one
    table each. (Other results files are not listed: a page that listed whatever lies in ``results/`` would differ
    between checkouts.)"""
    out = []
    docs = _load(folder)
    for name, doc in ((n, docs[n]) for n in HEADLINES if n in docs):
        prov = doc.get("provenance", {})
        out += [f"### {name}", "",
                f"`{doc.get('command', '?')}` ([{name}.json]({results_link}/{name}.json)); measured "
                f"{prov.get('date', '?')} on {prov.get('cpu', '?')} ({prov.get('cores', '?')} cores, load "
                f"{prov.get('load', '?')}), commit `{str(prov.get('commit', '?'))[:10]}`"
                + (" with uncommitted changes" if prov.get("dirty") else "")
                + (f", {doc['seconds']} s" if doc.get("seconds") is not None else "")
                + (f", {doc['sim_calls']:,} simulator calls" if doc.get("sim_calls") else "") + ".", "",
                "| figure | value |", "|---|---|"]
        figs = {k: v for k, v in doc.get("figures", {}).items() if k not in PAGE_SKIPS}
        tables = {k: v for k, v in figs.items() if _is_table(v)}
        out += [f"| {k} | {v} |" for k, v in _flatten({k: v for k, v in figs.items() if k not in tables})]
        out.append("")
        for k, v in tables.items():  # per-pair rows and the like: one table each, a line per entry
            out += [f"`{k}` ({len(v)}):", "", _table(v), ""]
    return "\n".join(out).rstrip()


def _is_table(x: Any) -> bool:
    """A list of two or more dicts of scalars (per-pair rows): the page shows it as one table."""
    return (isinstance(x, list) and len(x) > 1 and all(isinstance(r, dict) for r in x)
            and all(not isinstance(v, (dict, list)) for r in x for v in r.values()))


def _table(rows: list[dict[str, Any]]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))  # every key, in first-seen order; a missing one: blank
    return "\n".join([f"| {' | '.join(cols)} |", "|" + "---|" * len(cols)]
                      + [f"| {' | '.join(_flatten(r[c])[0][1] if c in r else '' for c in cols)} |" for r in rows])


def suite_table(folder: Path) -> str:
    """docs/evaluate_suite.md's summary: per case the best single device, op-level placement and stage plan
    (``results/evaluate_suite.json``)."""
    doc = _load(folder).get("evaluate_suite")
    if doc is None:
        return "(no results/evaluate_suite.json: run python scripts/bench_suite.py)"
    fig = doc["figures"]

    def names(best: dict) -> str:
        return ", ".join(best["placers"][:4]) + ("..." if len(best["placers"]) > 4 else "")

    lines = [f"Measured {measured_on(doc)}: `{doc.get('command', '?')}`, {fig['budget']:,} simulator calls per placer, "
             f"seed {fig['seed']}; costs {', '.join(fig['cost_sources'])}.", "",
             "| case | best single device (ms) | best op-level placer (ms) | speed-up | `sim_eft` / `eft_rollout` (ms; "
             "calls) | best stage plan (ms) | speed-up | exhaustive optimum |", "|---|---|---|---|---|---|---|---|"]
    for case, c in fig["cases"].items():
        op, plan, h = c.get("placement"), c.get("stage_plan"), c.get("heuristics") or {}
        single = f"{c['single_device_ms']:.2f}" + ("" if c.get("single_device_fits") else " (does not fit)")
        heur = " / ".join(f"{h[k]['ms']:.2f}" for k in ("sim_eft", "eft_rollout") if k in h) + "; " + \
            " / ".join(str(h[k]["sim_calls"]) for k in ("sim_eft", "eft_rollout") if k in h) if h else "-"
        ex = c.get("exhaustive_ms") or {}
        exhaustive = "; ".join(f"{v:.2f} ms ({'op-level' if k == 'placement' else 'stage plans'})"
                               for k, v in ex.items()) or "too large"
        ratio = (lambda best: f"{best['speedup']:.2f}x" if c.get("single_device_fits") else "n/a")
        lines.append(f"| {case} | {single} | " + (f"{op['ms']:.2f} ({names(op)}) | {ratio(op)}" if op else "- | -")
                     + f" | {heur} | " + (f"{plan['ms']:.2f} ({names(plan)}) | {ratio(plan)}" if plan else "- | -")
                     + f" | {exhaustive} |")
    return "\n".join(lines)


def suite_rows_table(folder: Path, which: str) -> str:
    """docs/evaluate_suite.md's tables as ``placement-rl evaluate`` writes them: ``full`` (every row) or
    ``pipeline`` (the pipeline cases' summary), recorded by ``scripts/bench_suite.py``."""
    doc = _load(folder).get("evaluate_suite")
    tables = (doc or {}).get("figures", {}).get("tables")
    if not tables:
        return "(no tables in results/evaluate_suite.json: run python scripts/bench_suite.py)"
    return f"Measured {measured_on(doc)}: `{doc.get('command', '?')}`.\n\n" + tables[which].rstrip()


def recompute_table(folder: Path) -> str:
    """docs/tensor_parallel.md's activation recomputation figures (``results/bench_recompute.json``): saved bytes
    and, when measured, the deployed step time against the prediction, with the machine's load."""
    doc = _load(folder).get("bench_recompute")
    if doc is None:
        return "(no results/bench_recompute.json: run python scripts/bench_recompute.py)"
    fig = doc["figures"]
    lines = [f"Measured {measured_on(doc)}: `{doc.get('command', '?')}` (zoo `{fig['model']}`, "
             + ", ".join(f"{k} {v}" for k, v in fig["overrides"].items()) + ").", ""]
    if fig.get("rows"):
        lines += ["| recompute | saved for backward, deployed (MB) | priced (MB) | deployed / priced |",
                  "|---|---|---|---|"]
        lines += [f"| {r['recompute']} | {r['measured_mb']:.2f} | {r['priced_mb']:.2f} | {r['ratio']:.4f} |"
                  for r in fig["rows"]]
        lines.append("")
    t = fig.get("time")
    if t:
        lines += [f"Step time of the deployed one-process plans (median of {t['steps']} interleaved steps, "
                  f"{t['threads']} thread; load {t['load_before'][0]:.2f} before, {t['load_after'][0]:.2f} after) "
                  "against the prediction (per-op CPU profile, thread clock, "
                  f"{t['profile_repeats']} repeats):", "",
                  "| recompute | measured, median / fastest / CPU (ms) | predicted (ms) | measured / predicted, median / "
                  "fastest / CPU | over none, measured (median / CPU) | over none, predicted |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['recompute']} | {r['measured_ms']:.2f} / {r['measured_fastest_ms']:.2f} / "
                  f"{r['measured_cpu_ms']:.2f} | {r['predicted_ms']:.2f} | {r['ratio']:.3f} / {r['ratio_fastest']:.3f} "
                  f"/ {r['ratio_cpu']:.3f} | {100 * r['increase_measured']:+.1f}% / "
                  f"{100 * r['increase_measured_cpu']:+.1f}% | {100 * r['increase_predicted']:+.1f}% |"
                  for r in t["rows"]]
    return "\n".join(lines).rstrip()


def render_block(text: str, name: str, body: str, *, where: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise RenderError(f"{where}: no '{begin}' ... '{end}' markers to render between")
    return text[:i + len(begin)] + "\n" + body + "\n" + text[j:]


def render_all(root: Path, *, check: bool = False) -> list[Path]:
    """Render the README's figure table and docs/results.md from ``root/results``; returns the files that changed
    (``check``: that would change, writing nothing)."""
    from placement_rl.graph.io import atomic_write_text

    folder = root / "results"
    suite = root / "docs" / "evaluate_suite.md"
    targets = {root / "README.md": [(README_BLOCK, readme_table(headline_rows(folder)))],
               root / "docs" / "results.md": [(DOCS_BLOCK, results_page(folder))],
               suite: [("suite", suite_table(folder)), ("suite-pipeline", suite_rows_table(folder, "pipeline")),
                       ("suite-full", suite_rows_table(folder, "full"))],
               root / "docs" / "tensor_parallel.md": [("recompute", recompute_table(folder))]}
    changed = []
    for path, blocks in targets.items():
        old = new = path.read_text()
        for block, body in blocks:
            new = render_block(new, block, body, where=str(path))
        if new != old:
            changed.append(path)
            if not check:
                atomic_write_text(path, new)
    return changed
