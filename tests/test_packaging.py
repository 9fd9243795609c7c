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


# Hydra loads launchers only from its ``hydra_plugins`` namespace: the one name installed besides placement_rl
PLUGIN = "hydra_plugins.placement_rl_launcher"


def test_every_package_directory_is_listed_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    # package-dir mapping (a folder -> the package it is installed as)
    mapped = {("envs",): "placement_rl.envs", ("agents",): "placement_rl.agents",
              ("placement_rl", "hydra_plugins"): "hydra_plugins"}
    found = set()
    for top in ("placement_rl", "envs", "agents"):
        for p in (ROOT / top).rglob("__init__.py"):
            parts = p.parent.relative_to(ROOT).parts
            head = next((k for k in mapped if parts[:len(k)] == k), parts[:1])
            found.add(".".join([mapped.get(head, head[0]), *parts[len(head):]]))
    assert found - listed == set(), "add these packages to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == {"placement_rl.conf", "hydra_plugins"}  # a mapped folder; Hydra's namespace
    others = {name for name in listed if name.split(".")[0] != "placement_rl"}
    assert others == {"hydra_plugins", PLUGIN}, "only placement_rl and its Hydra launcher plugin are installed"
    assert setup["package-dir"]["hydra_plugins"] == "placement_rl/hydra_plugins"
    assert not (ROOT / "placement_rl" / "hydra_plugins" / "__init__.py").exists(), "hydra_plugins is a namespace"


def _hydra_finds_the_launcher(python: str, cwd: Path, env: dict) -> None:
    """Hydra's own plugin scan, in a fresh interpreter, finds the sweep launcher and its config."""
    code = ("from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher;"
            "from hydra.core.config_store import ConfigStore;"
            "names = [f'{c.__module__}.{c.__name__}' for c in Plugins.instance().discover(Launcher)];"
            "print(names); print(ConfigStore.instance().list('hydra/launcher'))")
    out = _run([python, "-c", code], cwd, env).stdout
    assert f"'{PLUGIN}.ray_workers.RayWorkersLauncher'" in out and "'ray_workers.yaml'" in out, out


def test_hydra_finds_the_launcher_plugin_in_this_install(tmp_path):
    """The install the tests run on (``pip install -e .`` in a checkout): reinstall after pyproject.toml changes."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _hydra_finds_the_launcher(sys.executable, tmp_path, env)


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


def _clean_copy(src: Path) -> Path:
    """The checkout's installable files (no stale build/, caches or run folders)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "outputs", "multirun")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("placement_rl", "envs", "agents", "conf"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    return src


def _fresh_venv(venv: Path, env: dict) -> Path:
    """A venv that sees this environment's third-party packages (torch, hydra, ...) through a .pth line (its .pth
    files, such as an editable install's finder, are not run); returns its python."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent, env)
    py = venv / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        venv.parent, env).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (purelib / "_outer_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return py


@pytest.mark.slow
def test_editable_install_exposes_the_launcher_plugin_to_hydra(tmp_path):
    """``pip install -e .`` (the README's install): setuptools' editable finder maps hydra_plugins to
    placement_rl/hydra_plugins/, and Hydra's scan of the namespace finds the launcher there."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLACEMENT_RL_CONF")}
    src = _clean_copy(tmp_path / "src")
    py = _fresh_venv(tmp_path / "venv", env)
    cmd = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", "-e", str(src)]
    _run(cmd + ([] if _build_isolation_needed() else ["--no-build-isolation"]), tmp_path, env)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(py), "-c", "import hydra_plugins.placement_rl_launcher as p; print(p.__file__)"], work, env)
    assert where.stdout.strip() == str(src / "placement_rl" / "hydra_plugins" / "placement_rl_launcher" /
                                        "__init__.py")
    _hydra_finds_the_launcher(str(py), work, env)


@pytest.mark.slow
def test_wheel_carries_the_configs_and_runs_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLACEMENT_RL_CONF")}
    dist = tmp_path / "dist"
    src = _clean_copy(tmp_path / "src")
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(dist)]
    _run(cmd + ([] if _build_isolation_needed() else ["--no-build-isolation"]), tmp_path, env)
    wheel = next(dist.glob("placement_rl-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    conf = ROOT / "conf"
    want = {f"placement_rl/conf/{p.relative_to(conf).as_posix()}" for p in conf.rglob("*.yaml")}
    assert want and want <= set(names), sorted(want - set(names))[:5]
    plugin = {n for n in names if n.startswith("hydra_plugins/")}
    assert plugin == {f"hydra_plugins/placement_rl_launcher/{f}" for f in ("__init__.py", "ray_workers.py")}, plugin
    assert not any(n.startswith("placement_rl/hydra_plugins/") for n in names)  # installed once, as the plugin

    # A fresh venv with the wheel installed into it
    venv = tmp_path / "venv"
    py = _fresh_venv(venv, env)
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], tmp_path, env)

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(py), "-c", "import placement_rl; print(placement_rl.__file__)"], work, env).stdout
    assert where.startswith(str(venv))
    _hydra_finds_the_launcher(str(py), work, env)
    cli = str(venv / "bin" / "placement-rl")
    out = _run([cli, "inspect", "graph=mlp"], work, env).stdout
    assert "graph mlp" in out and list(work.glob("outputs/inspect/*/graph.json"))
    out = _run([cli, "inspect", "-m", "graph=synthetic", "graph.num_nodes=10,20", "hydra/launcher=ray_workers",
                "hydra.launcher.workers=2", "hydra.sweep.dir=sweep"], work, env).stdout
    assert "[2/2]" in out and "private local Ray instance" in out, out
    assert (work / "sweep" / "0" / "graph.json").is_file() and (work / "sweep" / "1" / "graph.json").is_file()
    out = _run([cli, "evaluate", "suite=single", "graph=mlp", "topology=2x_cpu", "budget=20", "pipeline=false",
                "progress=false"], work, env).stdout
    assert "mlp/2x_cpu" in out and list(work.glob("outputs/evaluate/*/comparison.md"))
    # a user's own config directory is searched too
    (work / "mine" / "graph").mkdir(parents=True)
    (work / "mine" / "graph" / "tiny_mlp.yaml").write_text(
        "source: zoo\nname: mlp\noverrides: {layers: 1}\ncoarsen: {enabled: false}\n")
    out = _run([cli, "inspect", "--config-dir", str(work / "mine"), "graph=tiny_mlp"], work, env).stdout
    assert "graph mlp" in out
