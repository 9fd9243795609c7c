"""An ensemble of independently pretrained constructive policies as one checkpoint (``combine``).

Pretraining seeds imitate the same teacher and err in different places; ``EnsemblePolicy`` averages their logits,
so one greedy decode (the schedule features computed once, M small heads scored on them) follows the decisions the
seeds agree on. The checkpoint is an ordinary constructive checkpoint (``algo="constructive"``) whose config says
``members: M`` and whose ``provenance.members`` names each member (file, sha256, seed, its own provenance):
``load_policy`` builds the ensemble from it, and ``place`` / ``train`` / ``evaluate`` use it as any policy.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Sequence

from agents.checkpoint import provenance, save_checkpoint
from agents.constructive_config import ALGO, _obs_dims, load_policy
from agents.device_policy import EnsemblePolicy
from placement_rl.errors import CheckpointError

# the fields every member must share: the architecture and the states it reads
SHARED = ("encoder", "hidden", "layers", "window", "full_window", "full_window_train")


def combine(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Write the ensemble of the constructive checkpoints ``paths`` (>= 2, one architecture and window) to ``out``."""
    if len(paths) < 2:
        raise CheckpointError(f"an ensemble needs at least 2 checkpoints, got {len(paths)}")
    loaded = [load_policy(p) for p in paths]
    first = loaded[0][1]
    for p, (pol, cfg, _) in zip(paths, loaded):
        if getattr(pol, "members", None) is not None:
            raise CheckpointError(f"checkpoint '{p}' is already an ensemble: combine its members' checkpoints")
        diff = [k for k in SHARED if getattr(cfg, k) != getattr(first, k)]
        if diff:
            raise CheckpointError(f"checkpoint '{p}' differs from '{paths[0]}' in {', '.join(diff)}: the members of "
                                  f"an ensemble share one architecture and lookahead window")
    ens = EnsemblePolicy([pol for pol, _, _ in loaded])
    cfg = dataclasses.replace(first, members=len(loaded))
    members = [{"file": Path(p).name, "run": Path(p).parent.name,
                "sha256": hashlib.sha256(Path(p).read_bytes()).hexdigest(), "seed": int(c.seed),
                "provenance": raw["config"].get("provenance", {})} for p, (_, c, raw) in zip(paths, loaded)]
    config = {**dataclasses.asdict(cfg), "provenance": {**provenance(), "members": members}}
    return save_checkpoint(out, algo=ALGO, config=config, obs=_obs_dims(),
                           num_timesteps=sum(int(raw.get("num_timesteps", 0)) for _, _, raw in loaded),
                           policy=ens.state_dict(), optimizer=None)


__all__ = ["SHARED", "combine"]
