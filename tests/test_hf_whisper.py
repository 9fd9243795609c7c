"""graph=hf with Whisper: a bare ``model_type=whisper``, ``graph.task=seq2seq_lm`` or a config naming
``WhisperForConditionalGeneration`` (as hub configs do) captures the whole encoder-decoder on audio features (a
bare config once captured its decoder alone, silently); ``graph.task=causal_lm`` captures the decoder alone
(``WhisperForCausalLM``, its text head) with one warning line saying so and how to get the whole model."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from placement_rl.graph.models import hf_auto  # noqa: E402
from placement_rl.graph.spec import graph_from_spec  # noqa: E402

torch.set_num_threads(1)
TINY = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32, num_mel_bins=16)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == hf_auto.__name__]


def test_the_decoder_alone_is_captured_on_request_and_said_in_one_line(caplog):
    assert hf_auto.build(model_type="whisper", overrides=TINY, batch_size=2, seq_len=16)[2]["class"] == \
        "WhisperForConditionalGeneration"  # a bare config: the whole model
    with caplog.at_level(logging.WARNING):
        _, (ids, labels), desc = hf_auto.build(model_type="whisper", task="causal_lm", overrides=TINY, batch_size=2,
                                               seq_len=16)
    assert (desc["task"], desc["class"], tuple(ids.shape)) == ("causal_lm", "WhisperForCausalLM", (2, 16))
    [line] = _warnings(caplog)
    assert "\n" not in line and "decoder of the 'whisper' encoder-decoder alone" in line
    assert "graph.task=seq2seq_lm captures the whole encoder-decoder (WhisperForConditionalGeneration)" in line


def test_seq2seq_task_captures_encoder_and_decoder_on_audio_features(caplog):
    with caplog.at_level(logging.WARNING):
        g = graph_from_spec({"source": "hf", "model_type": "whisper", "task": "seq2seq_lm", "overrides": TINY,
                             "batch_size": 2, "seq_len": 16, "coarsen": {"enabled": False}})
    desc = g.meta["hf"]
    assert (desc["task"], desc["class"], g.meta["capture_method"]) == ("seq2seq_lm", "WhisperForConditionalGeneration",
                                                                      "export")
    assert desc["audio_features"] == [16, 64]  # num_mel_bins x 2 max_source_positions frames
    assert not _warnings(caplog)
    assert sum(op == "conv1d" or "convolution" in op for op in g.op_types) == 2  # the encoder's two convolutions
    # every trainable parameter is in the step (the sinusoidal encoder positions are frozen)
    assert g.meta["unused_param_bytes"] == 0 and g.param_bytes.sum() == pytest.approx(
        4 * (desc["params"] - TINY["max_source_positions"] * TINY["d_model"]))
    decoder = hf_auto.build(model_type="whisper", task="causal_lm", overrides=TINY, batch_size=2, seq_len=16)[2]
    assert desc["params"] > decoder["params"]  # plus the encoder


def test_config_naming_the_encoder_decoder_captures_it(tmp_path: Path, caplog):
    from transformers import WhisperConfig

    for cls, task in (("WhisperForConditionalGeneration", "seq2seq_lm"), ("WhisperForCausalLM", "causal_lm")):
        WhisperConfig(**TINY, architectures=[cls]).save_pretrained(tmp_path / cls)
        assert json.loads((tmp_path / cls / "config.json").read_text())["architectures"] == [cls]
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _, (inputs, _), desc = hf_auto.build(config=str(tmp_path / cls), batch_size=2, seq_len=16)
        assert (desc["task"], desc["class"]) == (task, cls)
        assert not _warnings(caplog)  # the class the config names: nothing to warn about
        assert tuple(inputs.shape) == ((2, 16, 64) if task == "seq2seq_lm" else (2, 16))
