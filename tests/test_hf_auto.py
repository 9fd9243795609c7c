"""graph.source=hf: any transformers model from its config, built on the meta device and captured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from placement_rl.cost import resolve_costs, simulate  # noqa: E402
from placement_rl.errors import GraphError  # noqa: E402
from placement_rl.graph.capture import capture_zoo  # noqa: E402
from placement_rl.graph.models import hf_auto  # noqa: E402
from placement_rl.graph.spec import graph_from_spec  # noqa: E402
from placement_rl.topology import load_topology  # noqa: E402

torch.set_num_threads(1)

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=500)
LLAMA = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=1408, vocab_size=32000, tie_word_embeddings=False)


def _hf(**spec):
    return graph_from_spec({"source": "hf", "batch_size": 2, "seq_len": 16, **spec})


def test_same_graph_as_the_zoo_builder_with_the_same_config():
    """A Llama / Mixtral config through graph.source=hf (meta device) gives the zoo's (real weights) graph:
    same nodes, FLOPs, parameter and activation bytes; overrides re-derive the head size from the hidden size."""
    for zoo_name, kind, extra, opts in (("llama_hf", "llama", {}, {}),
                                        ("mixtral_hf", "mixtral", dict(num_local_experts=8, num_experts_per_tok=2,
                                                                       router_aux_loss_coef=0.0), {})):
        z = capture_zoo(zoo_name, batch_size=2, seq_len=64, n_layers=2, **opts)
        h = graph_from_spec({"source": "hf", "model_type": kind, "overrides": {**LLAMA, **extra},
                             "batch_size": 2, "seq_len": 64})
        assert h.num_nodes == z.num_nodes
        for key in ("fwd_flops", "bwd_flops", "param_bytes", "out_bytes"):
            assert getattr(h, key).sum() == pytest.approx(getattr(z, key).sum(), rel=1e-9), (kind, key)
        assert h.meta["hf"]["task"] == "causal_lm" and h.meta["hf"]["params"] * 4 == pytest.approx(
            z.param_bytes.sum(), rel=1e-9)
    from placement_rl.cli.inspect import summarize

    assert "transformers MixtralForCausalLM (causal_lm): " in summarize(h)  # what inspect says was built


@pytest.mark.parametrize("kind,task,extra", [
    ("qwen2", "causal_lm", dict(num_key_value_heads=2)),
    ("bert", "masked_lm", {}),
    ("t5", "seq2seq_lm", dict(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16)),
    ("vit", "image_classification", dict(image_size=32, patch_size=8)),
])
def test_architectures_capture_and_place(kind, task, extra):
    """Decoder, encoder, encoder-decoder and vision models: the task is read from the config, the graph has the
    training step's work (backward about twice the forward), and a placement of it simulates."""
    small = {k: v for k, v in SMALL.items() if kind != "t5" or k == "vocab_size"}
    if kind == "vit":
        small.pop("vocab_size")
    g = _hf(model_type=kind, overrides={**small, **extra})
    assert g.meta["hf"]["task"] == task
    assert g.fwd_flops.sum() > 0 and 1.5 < g.bwd_flops.sum() / g.fwd_flops.sum() < 2.5
    n_params = g.meta["hf"]["params"]
    assert g.param_bytes.sum() == pytest.approx(4 * n_params, rel=0.01)  # fp32, every parameter claimed once
    topo = load_topology("4x_h100_nvlink")
    costs = resolve_costs(g, topo)
    res = simulate(g, costs, topo, np.arange(g.num_nodes) % topo.num_devices)
    assert np.isfinite(res.step_time) and res.step_time > 0


def test_a_large_config_captures_without_its_weights(tmp_path: Path):
    """A 0.5B-parameter config.json (as save_pretrained writes it, bfloat16 as on the hub) with 4 of its 24
    layers: built on the meta device in fp32, its FLOPs are the dense-transformer count (2 x params x tokens,
    within the attention's share)."""
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(tmp_path / "qwen")
    path = tmp_path / "qwen" / "config.json"  # as on the hub: the weights' dtype is bfloat16
    path.write_text(json.dumps({**json.loads(path.read_text()), "dtype": "bfloat16", "torch_dtype": "bfloat16"}))
    g = graph_from_spec({"source": "hf", "config": str(tmp_path / "qwen"), "overrides": {"num_hidden_layers": 4},
                         "batch_size": 1, "seq_len": 512})
    desc = g.meta["hf"]
    assert desc["task"] == "causal_lm" and desc["config"]["num_hidden_layers"] == 4
    assert g.param_bytes.sum() == 4 * desc["params"]  # captured in fp32 whatever the config's dtype
    layer = 4 * (896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864)  # q, o, k, v (2 KV heads of 64) and the MLP
    dense = 2 * 512 * (layer + 896 * 151936)  # + the tied LM head
    assert 1.0 < g.fwd_flops.sum() / dense < 1.15  # attention scores and values add a few percent at 512 tokens


@pytest.mark.parametrize("spec,needle", [
    ({"model_type": "nosuch"}, "knows no such model type"),
    ({"model_type": None}, "needs graph.config"),
    ({"config": "missing.json"}, "no such config.json"),
    ({"model_type": "llama", "overrides": {"nosuch": 1}}, "has no field 'nosuch'"),
    ({"model_type": "vit", "task": "causal_lm"}, "no AutoModelForCausalLM"),
    ({"model_type": "llama", "overrides": {"num_hidden_layers": 0}}, "must be >= 1"),
    ({"model_type": "llama", "overrides": {"hidden_size": 100, "num_attention_heads": 3}}, "refuses these fields"),
    ({"model_type": "gpt2", "seq_len": 5000}, "longer than the config's 1024 positions"),
    ({"model_type": "whisper", "seq_len": 500}, "longer than the config's 448 positions .max_target_positions"),
    ({"model_type": "qwen2", "overrides": {"num_attention_heads": 7}}, "hidden_size 4096, not a multiple of its 7"),
    ({"model_type": "qwen2", "overrides": {"num_attention_heads": 8, "num_key_value_heads": 3}},
     "8 attention heads, not a multiple of its 3 key-value heads"),
    ({"model_type": "llama", "task": "regression"}, "choose one of"),
])
def test_bad_specs_name_what_to_fix(spec, needle):
    with pytest.raises(GraphError, match=needle.replace("(", r"\(")):
        graph_from_spec({"source": "hf", "batch_size": 1, "seq_len": 16, **spec})


def test_bad_config_file(tmp_path: Path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(GraphError, match="not a JSON config"):
        hf_auto.load_config(str(tmp_path), None, None)
    bad.write_text(json.dumps({"hidden_size": 3}))
    with pytest.raises(GraphError, match="names its 'model_type'"):
        hf_auto.load_config(str(bad), None, None)


@pytest.mark.slow
def test_cli_places_a_config(tmp_path: Path):
    """The README's line for one's own model: exit 0 and a placement of the graph it names; a bad field: one line,
    exit 2."""
    from transformers import LlamaConfig

    LlamaConfig(**{**SMALL, "num_key_value_heads": 2}).save_pretrained(tmp_path / "cfg")
    base = [sys.executable, "-m", "placement_rl.cli.main", "place", "graph=hf", f"graph.config={tmp_path / 'cfg'}",
            "topology=4x_v100_nvlink", "samples=2", "compare=false", "progress=false"]
    r = subprocess.run(base + [f"hydra.run.dir={tmp_path}/run"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads((tmp_path / "run" / "placement.json").read_text())
    graph = json.loads((tmp_path / "run" / "graph.json").read_text())
    assert plan["graph"] == graph["name"] == "hf:llama" and len(plan["device_of_node"]) == len(graph["nodes"])
    assert graph["meta"]["hf"]["task"] == "causal_lm"
    r = subprocess.run([sys.executable, "-m", "placement_rl.cli.main", "deploy",
                        f"plan={tmp_path / 'run' / 'placement.json'}", "topology=4x_v100_nvlink",
                        f"hydra.run.dir={tmp_path}/deploy"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "without weights" in r.stderr and r.stderr.strip().count("\n") == 0
    r = subprocess.run(base + ["+graph.overrides.hiden_size=3", f"hydra.run.dir={tmp_path}/bad"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "hiden_size" in r.stderr
    assert not (tmp_path / "bad" / "placement.json").exists()


@pytest.mark.parametrize("kind,overrides", [
    ("qwen2", dict(SMALL, num_key_value_heads=2)),
    ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=500)),
    ("falcon", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=500)),  # x @ W.T
])
def test_tensor_parallel_pairs_are_found(kind, overrides):
    """Two layers: an attention pair and an MLP pair each (Falcon's linears are ``x @ self.weight.T``: found
    once the transpose is folded into its matmul)."""
    from placement_rl.graph import tp

    g = _hf(model_type=kind, overrides=overrides)
    kinds = [tp.KINDS[k] for k in tp.annotation(g).kind]
    assert kinds.count("row") == 4 and kinds.count("column") >= 4


def test_fused_attention_keeps_the_flops_and_drops_the_seq_by_seq_memory():
    """attention=sdpa: one op per attention with the eager graph's FLOPs; its saved activations are a fused
    kernel's (inputs, output, log-sum-exp), so the seq x seq probabilities eager keeps per layer are gone; the
    config's head counts still bound the TP degree (the fused op hides the score matmul)."""
    from placement_rl.graph import tp

    b, s, heads = 2, 512, 8
    opts = dict(model_type="llama", overrides=dict(LLAMA, num_attention_heads=heads), batch_size=b, seq_len=s)
    eager = graph_from_spec({"source": "hf", **opts})
    sdpa = graph_from_spec({"source": "hf", "attention": "sdpa", **opts})
    assert sdpa.fwd_flops.sum() == pytest.approx(eager.fwd_flops.sum(), rel=1e-9)
    assert sdpa.bwd_flops.sum() == pytest.approx(eager.bwd_flops.sum(), rel=1e-9)
    fused = [v for v in range(sdpa.num_nodes) if "scaled_dot_product" in sdpa.op_types[v]]
    assert len(fused) == 2 and "softmax" not in {t.split(".")[-1] for t in sdpa.op_types}
    probs = b * heads * s * s * 4  # one layer's fp32 attention probabilities
    assert eager.act_bytes.sum() - sdpa.act_bytes.sum() > 2 * 0.5 * probs  # less the fused op's own inputs
    for v in fused:  # below one layer's probabilities
        assert sdpa.act_bytes[v] < probs  # q, k, v (repeated to all heads), output, the mask the model passes
    ann = tp.annotation(sdpa)
    assert {4, 8} <= set(ann.divisors) and [tp.KINDS[k] for k in ann.kind].count("row") == 4
    with pytest.raises(GraphError, match="graph.attention=flash: choose one of"):
        graph_from_spec({"source": "hf", "attention": "flash", **opts})


TINY_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                patch_size=8)
TINY_S2S = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=128, decoder_ffn_dim=128)


@pytest.mark.parametrize("kind,overrides,task,cls", [
    # the task is one the type has a class for: BEiT has a vocabulary (masked image modelling) but only an image
    # classifier; Whisper is an encoder-decoder config captured whole (its text head alone is the decoder's
    # causal LM)
    ("beit", TINY_VIT, "image_classification", "BeitForImageClassification"),
    ("whisper", dict(TINY_S2S, max_source_positions=32, num_mel_bins=16), "seq2seq_lm",
     "WhisperForConditionalGeneration"),
    # two image classifiers for one type and no architectures (transformers iterates None)
    ("deit", TINY_VIT, "image_classification", "DeiTForImageClassification"),
    # one head count per stage (a tuple): the head size is not read from it
    ("swin", dict(embed_dim=32, depths=[1, 1], num_heads=[2, 4], image_size=32, patch_size=4, window_size=4),
     "image_classification", "SwinForImageClassification"),
    # no image size in a convolutional net's config: 224 x 224
    ("resnet", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]), "image_classification",
     "ResNetForImageClassification"),
    # LayerDrop on by default (a random layer skip export cannot trace): off, every layer captured by export
    ("m2m_100", dict(TINY_S2S, vocab_size=500), "seq2seq_lm", "M2M100ForConditionalGeneration"),
    # max_position_embeddings = -1 (no limit) and torch.FloatTensor parameters made off the meta device
    ("xlnet", dict(d_model=64, n_layer=2, n_head=4, d_inner=128, vocab_size=500), "causal_lm", "XLNetLMHeadModel"),
    # a fixed 54-entry default layer-type list: cut to the 2 layers asked for
    ("zamba2", dict(SMALL, mamba_d_state=16, mamba_headdim=16, n_mamba_heads=8), "causal_lm", "Zamba2ForCausalLM"),
    # a heterogeneous config: reading its per-layer head_dim raises (not an AttributeError)
    ("gemma4_text", dict(SMALL, num_key_value_heads=2, head_dim=16, vocab_size_per_layer_input=500,
                         hidden_size_per_layer_input=16), "causal_lm", "Gemma4ForCausalLM"),
])
def test_families_the_builder_refused_or_crashed_on(kind, overrides, task, cls):
    g = _hf(model_type=kind, overrides=overrides)
    desc = g.meta["hf"]
    assert (desc["task"], desc["class"], g.meta["capture_method"]) == (task, cls, "export")
    assert desc.get("image_size") == ({"resnet": 224}.get(kind, 32) if task == "image_classification" else None)
    assert g.fwd_flops.sum() > 0 and g.bwd_flops.sum() > 0
    assert 0.99 * 4 * desc["params"] <= g.param_bytes.sum() + g.meta["unused_param_bytes"] <= 4 * desc["params"]
    if kind in ("swin", "resnet"):  # inspect names the attention kernel only for a model that attends
        from placement_rl.cli.inspect import summarize

        assert ("eager attention" in summarize(g)) == (kind == "swin")


def test_composite_config_overrides_reach_its_text_model(tmp_path: Path):
    """gemma3 (Gemma3ForConditionalGeneration) keeps its language model in text_config: a top-level field it
    lacks is set there, a mapping sets a sub-config's fields, the vocabulary is the text model's; from a file, the
    file's other text fields stay and its per-layer list follows the layer count. Captured on text alone."""
    text = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                vocab_size=500, head_dim=16)
    g = _hf(model_type="gemma3", overrides={**text, "num_hidden_layers": 2,
                                            "vision_config": {"num_hidden_layers": 1}})
    desc = g.meta["hf"]
    assert desc["task"] == "causal_lm" and desc["class"] == "Gemma3ForConditionalGeneration"
    assert desc["config"]["num_hidden_layers"] == 2 and desc["config"]["vocab_size"] == 500
    assert g.param_bytes.sum() < 4 * desc["params"]  # the vision tower's parameters are unused on text
    assert 4 * desc["unused_params"] == pytest.approx(g.meta["unused_param_bytes"], rel=0.01)  # and said so
    cfg = hf_auto.load_config(None, "gemma3", {"vision_config": {"num_hidden_layers": 1}})
    assert cfg.vision_config.num_hidden_layers == 1 and cfg.text_config.num_hidden_layers == 26  # the default
    from transformers import Gemma3Config

    Gemma3Config(text_config=dict(text, num_hidden_layers=6), architectures=["Gemma3ForConditionalGeneration"]
                 ).save_pretrained(tmp_path / "g3")
    cfg = hf_auto.load_config(str(tmp_path / "g3"), None, {"num_hidden_layers": 3})
    assert cfg.text_config.num_hidden_layers == 3 and cfg.text_config.hidden_size == 64
    assert len(cfg.text_config.layer_types) == 3
    with pytest.raises(GraphError, match="has no field 'vision_config.nosuch'"):
        hf_auto.load_config(None, "gemma3", {"vision_config": {"nosuch": 1}})


def test_per_layer_fields_follow_a_smaller_layer_count(tmp_path: Path):
    """gemma4's text config keys per-layer overrides by layer index ({"05": {"head_dim": 512}, ...}): with fewer
    layers the indices past the last go, whether the text config is the file's or the composite's default."""
    from transformers import Gemma4TextConfig

    Gemma4TextConfig().save_pretrained(tmp_path / "g4")
    assert "05" in json.loads((tmp_path / "g4" / "config.json").read_text())["per_layer_config"]
    cfg = hf_auto.load_config(str(tmp_path / "g4"), None, {"num_hidden_layers": 8})
    assert cfg.num_hidden_layers == 8 and len(cfg.layer_types) == 8
    assert sorted(int(k) for k in cfg.to_dict()["per_layer_config"]) == [5]
    cfg = hf_auto.load_config(None, "gemma4", {"num_hidden_layers": 2})  # routed to the default text_config
    assert cfg.text_config.num_hidden_layers == 2  # its per-layer fields derived again for 2 layers
    assert {int(k) for k in cfg.text_config.to_dict()["per_layer_config"]} <= {0, 1}


@pytest.mark.parametrize("spec,needle", [
    ({"model_type": "wav2vec2"}, "'wav2vec2' model type has no causal-LM, masked-LM, seq2seq-LM or image-class"),
    ({"model_type": "beit", "task": "causal_lm"}, "no AutoModelForCausalLM model (it has: image_classification)"),
])
def test_types_without_a_supported_head_are_one_line(spec, needle):
    with pytest.raises(GraphError, match=needle.replace("(", r"\(").replace(")", r"\)")) as err:
        graph_from_spec({"source": "hf", "batch_size": 1, "seq_len": 16, **spec})
    assert "\n" not in str(err.value)


def test_a_model_export_cannot_capture_is_one_line_without_capture_options():
    """flaubert calls .item() (no value on meta tensors): the error names the model and export's reason, not
    capture's method= / exec_mode= hints, which graph=hf does not take."""
    with pytest.raises(GraphError) as err:
        graph_from_spec({"source": "hf", "model_type": "flaubert", "batch_size": 1, "seq_len": 16,
                         "overrides": {"n_layers": 1, "emb_dim": 64, "n_heads": 4, "vocab_size": 300}})
    msg = str(err.value)
    assert msg.startswith("graph=hf: FlaubertWithLMHeadModel ('flaubert', masked_lm) cannot be captured")
    assert "item" in msg and "method=" not in msg and "exec_mode" not in msg and "\n" not in msg
