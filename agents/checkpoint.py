"""Checkpoints: policy weights + optimizer state + the training config, loadable with ``weights_only=True``.

Format (a dict of tensors and plain values, never pickled objects)::

    {"format": "placement_rl.checkpoint", "format_version": 1, "algo": "ppo" | "maskable_ppo" | "reinforce",
     "config": {...training config...}, "obs": {"max_nodes", "max_edges", "max_devices", "op_type_buckets",
     "num_features"}, "num_timesteps": int, "policy": state_dict, "optimizer": state_dict}

The config of an env policy (``agents.train.Trainer.save``) holds ``env_id``, ``encoder``, ``env_options`` (the
env's options as plain values; absent in checkpoints of earlier releases) and, for a warm-started ``PlacementEnv``
trained on one graph and topology, ``start``: ``{"graph": fingerprint, "graph_name", "topology": name,
"num_devices", "devices": [...]}``, the placement the next episode there starts from.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from placement_rl import results
from placement_rl.errors import CheckpointError
from placement_rl.graph.io import file_mode

FORMAT = "placement_rl.checkpoint"
FORMAT_VERSION = 1


def save_checkpoint(path: str | os.PathLike, *, algo: str, config: dict[str, Any], obs: dict[str, int],
                    num_timesteps: int, policy: dict[str, torch.Tensor], optimizer: dict[str, Any] | None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "algo": algo, "config": config, "obs": obs,
               "num_timesteps": int(num_timesteps), "policy": policy, "optimizer": optimizer or {}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with open(tmp, "wb") as fh:  # a file object: the archive's inner name is fixed, so equal checkpoints are
            torch.save(payload, fh)  # equal bytes (a path would name it after the random temporary file)
        os.chmod(tmp, file_mode(path))  # what open(path, "w") would give it, not mkstemp's private 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def provenance(**dataset: Any) -> dict[str, Any]:
    """Where a checkpoint comes from (``placement_rl.results``): the code's git commit (or ``unknown`` outside a
    checkout) and whether tracked files differed from it (``dirty``); hashes of the cost model (the modules that turn
    a graph and topology into costs and step times), of the state the policy reads (``state_sha``: its feature
    modules) and of the shipped fits (``placement_rl/data/*.json``, the rewards it was trained on); library
    versions; the ``dataset`` spec given. Plain values only (``weights_only`` loading)."""
    commit, dirty = results.git_state()
    hashes = results.code_hashes()
    return {"commit": commit, "dirty": dirty, **{k: hashes[k] for k in ("cost_model_sha", "state_sha", "fits_sha")},
            "versions": results.versions(),
            "dataset": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataset.items()}}


def load_checkpoint(path: str | os.PathLike, *, expect_algo: str | None = None) -> dict[str, Any]:
    """Load and check a checkpoint; every problem is a one-line ``CheckpointError``."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint '{p}' does not exist")
    with open(p, "rb") as fh:
        head = fh.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save: a zip (or a legacy pickle)
        kind = "a JSON file (a plan or placement?)" if _is_json(p) else "not a PyTorch file"
        raise CheckpointError(f"'{p}' is {kind}, not a checkpoint: give the checkpoint.pt that `placement-rl train` "
                              "writes (or leave checkpoint out for the shipped policy)")
    try:
        data = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's advice (weights_only=False) would run the file's code: never
        raise CheckpointError(f"'{p}' holds objects beyond weights and plain data: it is not a placement-rl "
                              "checkpoint (those hold nothing else)") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a user-facing problem
        raise CheckpointError(f"checkpoint '{p}' cannot be read ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"'{p}' is not a placement-rl checkpoint (no '{FORMAT}' header)")
    if data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint '{p}' has format version {data.get('format_version')!r}; this release "
                              f"reads version {FORMAT_VERSION}")
    if expect_algo is not None and isinstance(data.get("algo"), str) and data["algo"] != expect_algo:
        # before the fields: another agent's checkpoint holds other fields, not a damaged file
        raise CheckpointError(f"checkpoint '{p}' was trained with agent '{data['algo']}', not '{expect_algo}'")
    _check_fields(data, p)
    return data


def _is_json(p: Path) -> bool:
    import json

    try:
        return p.stat().st_size < 2**26 and json.loads(p.read_bytes()) is not None
    except (ValueError, OSError):
        return False


def _is_int(x: Any, low: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _check_fields(data: dict[str, Any], p: Path) -> None:
    """The fields every reader of a checkpoint uses are there, with their types (a damaged file says so)."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint '{p}' is damaged: {what}; re-train or re-download it")

    if not isinstance(data.get("algo"), str):
        raise bad("'algo' must be a string")
    config, obs, policy = data.get("config"), data.get("obs"), data.get("policy")
    if not isinstance(config, dict):
        raise bad("'config' must be a mapping")
    if not isinstance(obs, dict) or not all(isinstance(k, str) and _is_int(v) for k, v in obs.items()):
        raise bad("'obs' must map names to non-negative integers")
    if data["algo"] == "constructive":  # agents.constructive_train: encoder settings at the top of its config
        if not (isinstance(config.get("encoder"), str) and _is_int(config.get("hidden"), 1)
                and _is_int(config.get("layers"), 1)):
            raise bad("'config' must hold encoder, hidden and layers")
        if not _is_int(obs.get("num_node_features"), 1) or not _is_int(obs.get("num_device_features"), 1):
            raise bad("'obs' needs num_node_features and num_device_features >= 1")
    else:
        if not isinstance(config.get("env_id"), str):
            raise bad("'config.env_id' must be a string")
        enc = config.get("encoder")
        if not (isinstance(enc, dict) and isinstance(enc.get("name"), str) and _is_int(enc.get("hidden"), 1)
                and _is_int(enc.get("layers"), 1)):
            raise bad("'config.encoder' must hold name, hidden and layers")
        if not _is_int(obs.get("max_devices"), 1) or not _is_int(obs.get("op_type_buckets"), 1):
            raise bad("'obs' needs max_devices and op_type_buckets >= 1")
        opts = config.get("env_options", {})
        if not (isinstance(opts, dict) and all(isinstance(k, str) and (v is None or isinstance(v, (str, int, float)))
                                               for k, v in opts.items())):
            raise bad("'config.env_options' must map option names to plain values")
        start = config.get("start")
        if start is not None and not (isinstance(start, dict) and isinstance(start.get("graph"), str)
                                      and isinstance(start.get("topology"), str)
                                      and isinstance(start.get("devices"), list)
                                      and all(_is_int(d) for d in start["devices"])):
            raise bad("'config.start' must hold graph, topology and devices (non-negative integers)")
    if not isinstance(policy, dict) or not policy or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                            for k, v in policy.items()):
        raise bad("'policy' must map parameter names to tensors")
    if not _is_int(data.get("num_timesteps")):
        raise bad("'num_timesteps' must be a non-negative integer")
    if not isinstance(data.get("optimizer", {}), dict):
        raise bad("'optimizer' must be a mapping")


def check_compatible(data: dict[str, Any], *, obs: dict[str, int], config: dict[str, Any], keys: tuple[str, ...],
                     where: str = "checkpoint") -> None:
    """Fail clearly when a checkpoint's encoder/head settings differ from the run that loads it."""
    for k in ("max_devices", "op_type_buckets", "num_features"):
        if k in data["obs"] and k in obs and data["obs"][k] != obs[k]:
            raise CheckpointError(f"{where} was trained with {k}={data['obs'][k]}, this run has {k}={obs[k]}: "
                                  f"set env.{k}={data['obs'][k]} or train a new policy")
    for k in keys:
        a, b = data["config"].get(k), config.get(k)
        if a is not None and b is not None and a != b:
            raise CheckpointError(f"{where} was trained with {k}={a!r}, this run has {k}={b!r}")
