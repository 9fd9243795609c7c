"""The model settings export writes beside the parallel ones (docs/export.md): Megatron-LM's size and architecture
flags from the graph's metadata (a zoo GPT's options, the Hugging Face config a ``graph=hf`` Llama was captured
from), a ``# note:`` naming the flags the metadata does not record, torchtitan's model comment, and the note on
DDP combined with TP or PP that some torchtitan releases refuse."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from placement_rl import export as ex
from placement_rl.graph.capture import capture_zoo
from placement_rl.plans import StagePlan

torch.set_num_threads(1)
GPT = dict(batch_size=8, seq_len=8, vocab_size=97, d_model=16, n_layers=4, n_heads=2, dropout=0.1)
LLAMA_CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                    max_position_embeddings=2048, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def gpt():
    return capture_zoo("gpt", **GPT)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A Llama captured through ``graph=hf`` from a small config.json (GQA: 4 heads, 2 KV heads)."""
    pytest.importorskip("transformers")
    from placement_rl.graph.spec import graph_from_spec

    path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps(LLAMA_CONFIG))
    return graph_from_spec({"source": "hf", "config": str(path), "batch_size": 4, "seq_len": 16})


def flags(text: str) -> dict[str, str | bool]:
    """The arguments of a Megatron-LM text: flag -> value (True for a switch)."""
    body = " ".join(x for x in text.splitlines() if not x.startswith("#")).replace("\\", " ")
    return {m.group(1): m.group(2) or True for m in re.finditer(r"(--[a-z0-9-]+)(?:\s+([^-\s]\S*))?", body)}


def notes(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith("# note:")]


def two_stages(g, tp: int = 1) -> StagePlan:
    """Stage 0 up to and including the first layer, stage 1 the rest (nodes of no module follow as the readers
    place them)."""
    mods = ex.modules(g)
    first = mods.order[:mods.order.index(sorted(mods.layer, key=mods.layer.get)[0]) + 1]
    son = np.array([0 if k in first else 1 for k in mods.key], dtype=np.int64)
    groups = tuple(tuple(range(s * tp, (s + 1) * tp)) for s in range(2))
    plan = StagePlan(son, groups, tp=(tp, tp), num_microbatches=2)
    return ex.from_megatron(ex.to_megatron(plan, g, snap=True), g)  # nodes of no module where the readers put them


def test_megatron_writes_the_zoo_gpt_model(gpt):
    plan = two_stages(gpt, tp=2)
    text = ex.to_megatron(plan, gpt)
    a = flags(text)
    assert (a["--hidden-size"], a["--ffn-hidden-size"], a["--num-attention-heads"], a["--seq-length"],
            a["--max-position-embeddings"]) == ("16", "64", "2", "8", "8")
    assert (a["--attention-dropout"], a["--hidden-dropout"]) == ("0.1", "0.1")
    # GPT's architecture is Megatron-LM's default: no Llama flags, no query groups, nothing left to add
    assert not {"--normalization", "--swiglu", "--position-embedding-type", "--disable-bias-linear",
                "--group-query-attention", "--num-query-groups"} & set(a)
    assert notes(text) == []
    back = ex.from_megatron(text, gpt)  # the model flags do not disturb the reader
    assert np.array_equal(back.stage_of_node, plan.stage_of_node) and back.tp == plan.tp


def test_megatron_writes_a_hf_llama_model_and_names_what_the_config_kept_back(llama):
    plan = two_stages(llama, tp=2)
    text = ex.to_megatron(plan, llama)
    a = flags(text)
    assert (a["--hidden-size"], a["--ffn-hidden-size"], a["--num-attention-heads"], a["--seq-length"]) == \
        ("64", "128", "4", "16")
    assert a["--group-query-attention"] is True and a["--num-query-groups"] == "2"
    assert (a["--normalization"], a["--position-embedding-type"]) == ("RMSNorm", "rope")
    assert a["--swiglu"] is True and a["--disable-bias-linear"] is True
    assert a["--untie-embeddings-and-output-weights"] is True
    # the capture keeps no position table size or dropout: never guessed, named in one note
    assert not {"--max-position-embeddings", "--attention-dropout", "--hidden-dropout", "--kv-channels"} & set(a)
    (note,) = notes(text)
    assert "does not record --max-position-embeddings, --attention-dropout, --hidden-dropout" in note
    back = ex.from_megatron(text, llama)
    assert np.array_equal(back.stage_of_node, plan.stage_of_node) and back.tp == plan.tp


def test_mistral_sliding_window_and_unknown_architectures_get_notes(llama):
    mistral = replace(llama, meta={**llama.meta, "hf": {**llama.meta["hf"], "model_type": "mistral"}})
    plan = two_stages(llama)
    text = ex.to_megatron(plan, mistral)
    assert flags(text)["--swiglu"] is True
    assert any("sliding-window attention is not written" in x and "--window-size" in x for x in notes(text))
    assert any("sliding-window attention is not recorded" in x for x in notes(ex.to_torchtitan(plan, mistral)))
    opt = replace(llama, meta={**llama.meta, "hf": {**llama.meta["hf"], "model_type": "opt"}})
    text = ex.to_megatron(plan, opt)
    assert not {"--swiglu", "--normalization"} & set(flags(text))
    assert any("no architecture flags are written for model type 'opt'" in x for x in notes(text))


def test_a_graph_without_model_metadata_names_every_model_flag(gpt):
    bare = replace(gpt, meta={k: v for k, v in gpt.meta.items() if k not in ("zoo", "zoo_options")})
    text = ex.to_megatron(two_stages(gpt), bare)
    assert "--hidden-size" not in flags(text) and "--num-layers" in flags(text)
    (note,) = notes(text)
    assert "records no model settings: add --hidden-size" in note and "--seq-length" in note
    assert "records no model settings" in ex.to_torchtitan(two_stages(gpt), bare)


def test_torchtitan_names_the_model_and_sequence_length(gpt, llama):
    text = ex.to_torchtitan(two_stages(gpt), gpt)
    assert "# dim = 16, n_layers = 4, n_heads = 2, n_kv_heads = 2, ffn_hidden = 64, vocab_size = 97" in text
    assert "# and set [training] seq_len = 8" in text and notes(text) == []
    text = ex.to_torchtitan(two_stages(llama), llama)
    assert "# dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_hidden = 128, vocab_size = 500" in text
    assert "seq_len = 16" in text


def test_torchtitan_notes_ddp_combined_with_tp_or_pp(gpt):
    one = np.zeros(gpt.num_nodes, dtype=np.int64)
    pp = two_stages(gpt)
    cases = {"ddp x tp": (StagePlan(one, ((0, 1, 2, 3),), tp=(2,)), True),
             "ddp x pp": (replace(pp, stage_devices=((0, 1), (2, 3)), tp=(1, 1)), True),
             "fsdp x tp": (StagePlan(one, ((0, 1, 2, 3),), tp=(2,), sharding="fsdp"), False),
             "ddp alone": (StagePlan(one, ((0, 1),)), False),
             "tp x pp, dp 1": (two_stages(gpt, tp=2), False)}
    for name, (plan, said) in cases.items():
        got = [x for x in notes(ex.to_torchtitan(plan, gpt)) if "DDP has not supported > 1D parallelism" in x]
        assert len(got) == int(said), name


def test_megatron_writes_the_zoo_moe_router():
    """The zoo MoE's experts, top-k, capacity and load-balancing weight (Megatron-LM's default weight is 0: without
    the flag the exported job would train with no load-balancing loss)."""
    g = capture_zoo("moe", batch_size=4, seq_len=8, vocab_size=97, d_model=16, n_layers=2, n_heads=2, n_experts=4,
                    top_k=2, aux_coef=0.02)
    got = flags(ex.export_plan(two_stages(g), g, "megatron"))
    assert (got["--num-experts"], got["--moe-router-topk"], got["--moe-aux-loss-coeff"]) == ("4", "2", "0.02")
    assert got["--moe-expert-capacity-factor"] == "1.25" and got["--moe-token-dispatcher-type"] == "alltoall"
