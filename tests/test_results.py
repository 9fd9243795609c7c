"""Results as data: every figure the README and docs/results.md print is rendered from results/*.json
(``placement_rl.studies.render``), and the report generators type in no percentage or time figure."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from placement_rl.results import code_changed, provenance, read_result, write_result
from placement_rl.studies.headlines import _search_rows
from placement_rl.studies.render import RenderError, headline_rows, render_all, render_block

ROOT = Path(__file__).resolve().parent.parent
GENERATORS = sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "placement_rl" / "studies").glob("*report*.py"))
# a percentage or a time in microseconds / milliseconds / seconds, not part of a larger token
FIGURE = re.compile(r"(?<![\w.{%/-])\d+(?:[.,]\d+)?\s?(?:%|ms\b|us\b)")
# a threshold or a parameter stated in words, not a measured figure: "rows of at least 50 us", "within 10%"
THRESHOLD = re.compile(r"(?:>=|<=|>|<|at least|at most|under|over|above|below|within|up to)\s*$")


def typed_figures(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every figure typed into a string literal of ``source``: docstrings, f-string format
    specs and thresholds (``THRESHOLD`` right before the figure) are not figures."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            skip.update(id(n) for n in ast.walk(node.format_spec))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            for m in FIGURE.finditer(node.value):
                if not THRESHOLD.search(node.value[max(0, m.start() - 12):m.start()]):
                    found.append((node.lineno, m.group()))
    return found


def test_report_generators_type_in_no_figures():
    assert any(p.name == "fidelity_gpu.py" for p in GENERATORS)
    typed = {p.relative_to(ROOT).as_posix(): typed_figures(p.read_text()) for p in GENERATORS}
    typed = {k: v for k, v in typed.items() if v}
    assert not typed, f"figures typed into report generators (compute them or read them from results/): {typed}"


def test_the_figure_scan_finds_typed_figures_and_spares_computed_ones():
    src = ('"""Docstring: 12.5% is prose."""\n'
           'x = f"{a:.1f}% and {b:5.0%}"\n'
           'y = "conv 38.5% / 40.0% to 23.5%"\n'
           'z = "rows of at least 50 us, share within 10%"\n'
           'w = "took 3.2 ms"\n')
    assert typed_figures(src) == [(3, "38.5%"), (3, "40.0%"), (3, "23.5%"), (5, "3.2 ms")]


def test_documents_match_their_data():
    changed = render_all(ROOT, check=True)
    assert not changed, (f"{[str(p.relative_to(ROOT)) for p in changed]} differ from results/*.json: run "
                         "python scripts/render.py")


def _copy_tree(dest: Path) -> Path:
    (dest / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", dest / "README.md")
    for page in ("results.md", "evaluate_suite.md", "tensor_parallel.md"):
        shutil.copy(ROOT / "docs" / page, dest / "docs" / page)
    shutil.copytree(ROOT / "results", dest / "results")
    return dest


def test_a_figure_that_moved_in_its_json_is_caught(tmp_path):
    root = _copy_tree(tmp_path)
    assert render_all(root, check=True) == []
    p = root / "results" / "fidelity_h200.json"
    doc = json.loads(p.read_text())
    doc["figures"]["whole"]["calibrated"]["training_mape"] += 1.0
    p.write_text(json.dumps(doc))
    assert set(render_all(root, check=True)) == {root / "README.md", root / "docs" / "results.md"}
    render_all(root)
    assert render_all(root, check=True) == []
    assert f"{doc['figures']['whole']['calibrated']['training_mape']:.1f}%" in (root / "README.md").read_text()


def test_every_headline_row_links_its_json_and_carries_date_and_machine():
    rows = headline_rows(ROOT / "results")
    assert rows
    for r in rows:
        doc = read_result(r.result, folder=ROOT / "results")
        assert re.match(r"\d{4}-\d{2}-\d{2}, .+ \(\d+ cores\)", r.measured), r.measured
        assert r.command == doc["command"]
        script = next(w for w in r.command.split() if w.endswith(".py") or w == "placement-rl")
        assert script == "placement-rl" or (ROOT / "scripts" / Path(script).name).is_file(), r.command
    block = (ROOT / "README.md").read_text().split("<!-- figures:begin -->")[1].split("<!-- figures:end -->")[0]
    for link in re.findall(r"\]\((results/[\w.-]+\.json)\)", block):
        assert (ROOT / link).is_file(), link


def test_per_pair_rows_are_one_table_on_the_results_page(tmp_path):
    """A figure that is a list of flat dicts (per-pair rows) renders as one table, a line per row, every key a
    column (a key some rows lack: blank); a list holding nested values is flattened as before."""
    from placement_rl.studies.render import results_page

    rows = [{"pair": "a@x", "ms": 1.25, "ok": True}, {"pair": "b@y", "ms": float("nan"), "extra": 3}]
    write_result("learned_test", {"split": "test", "rows": rows, "nested": [{"k": [1, {"z": 2}]}, {"k": 1}]},
                 command="python scripts/bench_learned.py zeroshot", folder=tmp_path)
    page = results_page(tmp_path)
    assert "`rows` (2):" in page
    assert "| pair | ms | ok | extra |" in page and "| a@x | 1.25 | True |  |" in page
    assert "| b@y | null |  | 3 |" in page
    assert "rows[0]" not in page and "| nested[0].k[1].z | 2 |" in page


def test_an_anytime_trace_is_thinned_to_its_log_spaced_improvements():
    """A search bench keeps at most ``points`` entries of a trace in its results file: the first and the last
    (the result) exact, one per log-spaced interval of seconds; a short trace is kept whole."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_learned", ROOT / "scripts" / "bench_learned.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    trace = [[1e-3 * 1.01**i, i + 1, 1.0 - 1e-4 * i] for i in range(1500)]
    thin = bench.thin_trace(trace, points=50)
    assert len(thin) <= 50 and thin[0] == trace[0] and thin[-1] == trace[-1]
    assert all(a in trace for a in thin) and [e[0] for e in thin] == sorted(e[0] for e in thin)
    assert bench.thin_trace(trace[:40], points=50) == trace[:40]


def test_the_search_summary_leaves_out_every_ratio_whose_placements_do_not_both_fit():
    """``bench_learned.search_summary``: a ratio over a pair counts only where both of its placements fit memory
    (an infeasible step time ignores the overflow; an infeasible ``la_rule`` reference too); the infeasible ones
    are counted; the render reads the summary, so the README and the results file say the same."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_learned", ROOT / "scripts" / "bench_learned.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    methods = (*bench.SEARCHES, "policy_search")

    def row(pair, ms, ok=(), rule_ok=True):
        r = {"pair": pair, "seconds": 1.0, "graph_seed": 5, "la_rule_ms": 10.0, "la_rule_feasible": rule_ok,
             "best_over_bound": 1.0, **{f"{n}_ms": ms[i] for i, n in enumerate(methods)},
             **{f"{n}_feasible": n not in ok for n in methods}, **{f"{n}_s": 1.0 for n in methods}}
        fits = [n for n in bench.SEARCHES if r[f"{n}_feasible"]]
        r["best_search"] = min(fits, key=lambda n: r[f"{n}_ms"]) if fits else None
        best = min(r[f"{n}_ms"] for n in fits)
        r["policy_search_over_best_search"] = r["policy_search_ms"] / best if r["policy_search_feasible"] else 1e300
        return r

    rows = [row("a", [9.0, 9.0, 8.0, 8.0]),
            row("b", [9.0, 9.0, 4.0, 8.0], ok=("la_rule_search",)),  # overflows: left out of its ratios
            row("c", [5.0, 5.0, 5.0, 5.0], rule_ok=False)]  # the rule's reference overflows
    s = bench.search_summary(rows, [1.0])["1.0"]
    assert s["infeasible"]["la_rule_search"] == 1 and s["pairs"] == 3
    assert s["la_rule_search_over_la_rule"] == pytest.approx(0.8)  # pair a only (b overflows, c's rule does)
    assert s["policy_search_over_la_rule_search"] == pytest.approx(1.0)  # a and c, not b
    assert s["policy_search_over_local_search"] == pytest.approx((8 / 9 * 8 / 9 * 1.0) ** (1 / 3))
    page = _search_rows({"figures": {"split": "x", "summary": {"1.0": s}, "rows": rows}})
    assert ("`policy_search` over `la_rule_search` alone at equal seconds (`x`)", "1 s 1.000") in page


def test_render_block_needs_its_markers():
    assert render_block("a <!-- x:begin -->old<!-- x:end --> b", "x", "new", where="t") == \
        "a <!-- x:begin -->\nnew\n<!-- x:end --> b"
    with pytest.raises(RenderError, match="markers"):
        render_block("no markers", "x", "new", where="README.md")


def test_write_result_round_trip_with_provenance(tmp_path):
    path = write_result("demo", {"a": 1.5, "b": [1, 2]}, seconds=0.5, sim_calls=3, command="python demo.py",
                        folder=tmp_path)
    doc = read_result("demo", folder=tmp_path)
    assert path == tmp_path / "demo.json" and doc["figures"] == {"a": 1.5, "b": [1, 2]}
    assert doc["seconds"] == 0.5 and doc["sim_calls"] == 3 and doc["command"] == "python demo.py"
    prov = provenance()
    assert set(prov) <= set(doc["provenance"]) and {"commit", "dirty", "cpu", "cores", "date", "cost_model_sha"} \
        <= set(prov)
    with pytest.raises(ValueError, match="plain file stem"):
        write_result("../x", {}, folder=tmp_path)


def test_code_changed_ignores_the_reports_a_bench_writes(tmp_path):
    """A bench's own plot or JSON (results/, docs/) or a README edit is not a change of the code that measured."""
    import subprocess

    def git(*a):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=tmp_path, check=True,
                       capture_output=True)

    for rel in ("results/a.json", "docs/a.png", "README.md", "pkg/m.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("0")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "x")
    for rel in ("results/a.json", "docs/a.png", "README.md"):
        (tmp_path / rel).write_text("1")
    (tmp_path / "new.py").write_text("untracked")
    assert not code_changed(tmp_path)
    (tmp_path / "pkg/m.py").write_text("1")
    assert code_changed(tmp_path)


def test_the_readme_is_a_short_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for command in ('pip install -e ".[test]"', "python -m pytest -q", "python -m pytest -q -m slow"):  # verbatim
        assert command in text and command in (ROOT / ".ci" / "run").read_text()
    for link in re.findall(r"\]\(((?:docs|results)/[\w./-]+|CHANGELOG\.md)\)", text):
        assert (ROOT / link).exists(), f"README links {link}, which does not exist"


def test_the_suite_headline_takes_no_speedup_over_a_single_device_that_overflows():
    """gpt-large / gpt-xl on 2x small GPUs: the single device overflows, so their 1.96 x was no speed-up; the
    headline counts the cases where one device fits and the page shows n/a."""
    from placement_rl.studies.headlines import _suite_rows

    case = {"placement": {"speedup": 3.0, "ms": 1.0, "placers": ["a"]},
            "stage_plan": {"speedup": 9.0, "ms": 1.0, "placers": ["b"]}}
    doc = {"figures": {"budget": 10, "cases": {"fits": {**case, "single_device_fits": True,
                                                        "placement": {"speedup": 1.5, "ms": 2.0, "placers": ["a"]},
                                                        "stage_plan": {"speedup": 2.0, "ms": 2.0, "placers": ["b"]}},
                                               "overflows": {**case, "single_device_fits": False}}}}
    (_, op), (title, plan) = _suite_rows(doc)
    assert op.startswith("up to 1.50x (fits") and "1 cases where one device fits" in _suite_rows(doc)[0][0]
    assert "(1 cases)" in title and "9.00x" not in plan and "2.00x (fits)" in plan
