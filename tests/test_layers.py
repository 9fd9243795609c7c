"""The import layers hold (import-linter contracts in pyproject.toml, DESIGN.md's direction) and no file-level import
cycle exists, counting function-level imports and ``from package import name`` as an import of the package's
``__init__`` (the module Python runs first)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
# where each folder is installed (pyproject's package-dir mapping): the wheel's layout, which import-linter reads
SOURCES = {"placement_rl": ROOT / "placement_rl", "placement_rl.envs": ROOT / "envs",
           "placement_rl.agents": ROOT / "agents"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for prefix, base in SOURCES.items():
        for f in base.rglob("*.py"):
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if prefix == "placement_rl" and parts[:1] in (["envs"], ["agents"]):
                continue
            out[".".join([prefix, *parts])] = f
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute)
                                                                     and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every module an import statement anywhere in ``tree`` names (outside ``if TYPE_CHECKING:``): for
    ``from a.b import c`` both ``a.b`` and ``a.b.c`` (whichever are modules)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for stmt in child.orelse:
                    visit_one(stmt)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((base, node.lineno))
            found.extend((f"{base}.{a.name}", node.lineno) for a in node.names)
        visit(node)

    visit(tree)
    return found


def import_graph() -> nx.DiGraph:
    """Module -> imported module (with the line) over every module of the installed package."""
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for target, line in _imports(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            if target in mods and target != name:
                g.add_edge(name, target, line=line)
    return g


def test_no_file_level_import_cycles():
    g = import_graph()
    assert g.number_of_nodes() > 100 and "placement_rl.envs.reward" in g and "placement_rl.agents.checkpoint" in g
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    detail = [" / ".join(c) + ": " + ", ".join(f"{a} -> {b} (l.{d['line']})" for a, b, d in
                                                g.subgraph(c).edges(data=True)) for c in cycles]
    assert not cycles, "file-level import cycles:\n" + "\n".join(detail)


def test_the_cycle_finder_sees_function_level_and_package_imports():
    tree = ast.parse("def f():\n    from placement_rl.cost import calibrated\n"
                     "if TYPE_CHECKING:\n    import placement_rl.agents\n")
    got = {m for m, _ in _imports(tree, "placement_rl.cost.resolve", False)}
    assert got == {"placement_rl.cost", "placement_rl.cost.calibrated"}


def _mirror(dest: Path) -> Path:
    """The package laid out as the wheel installs it (envs/ and agents/ inside placement_rl/), source only."""
    skip = shutil.ignore_patterns("__pycache__", "data", "*.pyc")
    for prefix, base in SOURCES.items():
        shutil.copytree(base, dest.joinpath(*prefix.split(".")), ignore=skip, dirs_exist_ok=True)
    return dest


def _lint_imports(src: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with pyproject.toml's contracts over the package at ``src``."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
                          cwd=src, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=300)


def test_import_layers_hold(tmp_path):
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = config["contracts"][0]["layers"]
    assert layers[0] == "placement_rl.cli" and "placement_rl.envs" in layers and "placement_rl.agents" in layers
    src = _mirror(tmp_path / "src")
    run = _lint_imports(src)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_a_layer_breach_is_caught(tmp_path):
    src = _mirror(tmp_path / "src")
    with (src / "placement_rl" / "envs" / "reward.py").open("a") as fh:
        fh.write("\nimport placement_rl.agents.checkpoint  # a breach: envs below agents\n")
    run = _lint_imports(src)
    assert run.returncode != 0 and "placement_rl.envs.reward -> placement_rl.agents.checkpoint" in run.stdout


def test_only_placement_rl_is_installed_at_the_top_level():
    """Besides placement_rl, only the sweep launcher in Hydra's plugin namespace (Hydra loads launchers from there)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    names = set(setup["packages"]) | set(setup.get("package-dir", {}))
    tops = {p.split(".")[0] for p in names}
    assert tops == {"placement_rl", "hydra_plugins"}
    assert {p for p in names if p.startswith("hydra_plugins")} == {"hydra_plugins",
                                                                   "hydra_plugins.placement_rl_launcher"}
