"""The Python defaults are the shipped recipe: ``pretrain(PretrainSpec(), ConstructiveConfig())`` trains what
``placement-rl train trainer=pretrain`` trains (every field of both, composed from the CLI's own configs)."""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from placement_rl.agents.constructive_config import ConstructiveConfig
from placement_rl.cli.common import _compose
from placement_rl.cli.train import constructive_config
from placement_rl.studies.pretrain import PretrainSpec


def test_the_python_defaults_are_the_pretraining_recipe():
    cfg, _ = _compose("train", ["trainer=pretrain"], [])
    got = constructive_config(OmegaConf.create(cfg))
    want = ConstructiveConfig()
    diff = {f.name: (getattr(got, f.name), getattr(want, f.name)) for f in dataclasses.fields(ConstructiveConfig)
            if getattr(got, f.name) != getattr(want, f.name)}
    assert diff == {}, f"CLI recipe vs Python default: {diff}"
    p = dict(cfg["trainer"]["pretrain"])
    spec = PretrainSpec(**{**p, "sizes": tuple(p["sizes"]), "devices": tuple(p["devices"])})
    assert spec == PretrainSpec()
