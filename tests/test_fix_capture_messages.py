"""Capture errors that say what happened first and what to change: a model that cannot run on its example inputs
names the torch.export failure too (it read "cannot measure the fx graph" only), a transformers model called with
its key-value cache on gets the use_cache=False hint, and ``inspect`` names the config file it builds."""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.capture import capture

torch.set_num_threads(1)


def test_a_model_that_cannot_run_its_inputs_names_the_export_failure_too():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))  # batch norm in training at batch 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GraphError) as exc:
            capture(model, (torch.randn(1, 3),))
    text = str(exc.value)
    assert "cannot measure the fx graph" in text and "torch.export failed first (ValueError: Expected more" in text
    assert "\n" not in text


def test_a_transformers_model_with_its_cache_on_gets_the_use_cache_hint():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16, bos_token_id=0,
                                  eos_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GraphError, match="likely fix: call the transformers model with use_cache=False"):
            capture(transformers.GPT2LMHeadModel(cfg), (torch.randint(0, 100, (2, 8)),))


def test_inspect_names_the_config_it_builds_not_the_default_model_type():
    from placement_rl.cli.inspect import _building

    what, _ = _building(OmegaConf.create({"source": "hf", "model_type": "llama", "config": "cfg/gpt2.json"}))
    assert what == "transformers model cfg/gpt2.json"
    what, _ = _building(OmegaConf.create({"source": "hf", "model_type": "llama", "config": None}))
    assert what == "transformers model llama"
