"""The package as users get it: every package listed in pyproject.toml, and a wheel (configs inside) installed
non-editable into a fresh virtual environment runs the CLI from another directory."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    mapped = {"envs": "placement_rl.envs", "agents": "placement_rl.agents"}  # package-dir mapping
    found = set()
    for top in ("placement_rl", "envs", "agents"):
        for p in (ROOT / top).rglob("__init__.py"):
            parts = p.parent.relative_to(ROOT).parts
            found.add(".".join([mapped.get(parts[0], parts[0]), *parts[1:]]))
    assert found - listed == set(), "add these packages to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == {"placement_rl.conf"}
    assert not any(name.split(".")[0] != "placement_rl" for name in listed), "only placement_rl is installed"


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


def _build_isolation_needed() -> bool:
    try:
        import setuptools
    except ImportError:
        return True
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) < (70, 1)  # older setuptools needs the separate 'wheel' package: build in isolation


@pytest.mark.slow
def test_wheel_carries_the_configs_and_runs_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLACEMENT_RL_CONF")}
    dist = tmp_path / "dist"
    src = tmp_path / "src"  # a clean copy: no stale build/ of the checkout ends up in the wheel
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "outputs", "multirun")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("placement_rl", "envs", "agents", "conf"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(dist)]
    _run(cmd + ([] if _build_isolation_needed() else ["--no-build-isolation"]), tmp_path, env)
    wheel = next(dist.glob("placement_rl-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    conf = ROOT / "conf"
    want = {f"placement_rl/conf/{p.relative_to(conf).as_posix()}" for p in conf.rglob("*.yaml")}
    assert want and want <= set(names), sorted(want - set(names))[:5]

    # A fresh venv that sees this environment's third-party packages (torch, hydra, ...) through a .pth line
    # (its .pth files, such as an editable install's finder, are not run), with the wheel installed into it.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    py = venv / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        tmp_path, env).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (purelib / "_outer_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], tmp_path, env)

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(py), "-c", "import placement_rl; print(placement_rl.__file__)"], work, env).stdout
    assert where.startswith(str(venv))
    cli = str(venv / "bin" / "placement-rl")
    out = _run([cli, "inspect", "graph=mlp"], work, env).stdout
    assert "graph mlp" in out and list(work.glob("outputs/inspect/*/graph.json"))
    out = _run([cli, "evaluate", "suite=single", "graph=mlp", "topology=2x_cpu", "budget=20", "pipeline=false",
                "progress=false"], work, env).stdout
    assert "mlp/2x_cpu" in out and list(work.glob("outputs/evaluate/*/comparison.md"))
    # a user's own config directory is searched too
    (work / "mine" / "graph").mkdir(parents=True)
    (work / "mine" / "graph" / "tiny_mlp.yaml").write_text(
        "source: zoo\nname: mlp\noverrides: {layers: 1}\ncoarsen: {enabled: false}\n")
    out = _run([cli, "inspect", "--config-dir", str(work / "mine"), "graph=tiny_mlp"], work, env).stdout
    assert "graph mlp" in out
