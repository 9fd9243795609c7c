"""TP detection on ``graph=hf`` models with more between the LM head and the loss than views, or their KV heads under
another name: BART's word table (not its larger learned position table) is the vocab-parallel embedding; the LM
head and loss are vocab-split for BART (``final_logits_bias`` after the head) and Gemma2 (logit softcapping: div,
tanh, mul); a Falcon's KV heads are recorded, so a TP degree not dividing them is refused; the zoo models'
annotations are those detected before."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
import torch
from torch import nn

from placement_rl.errors import PlanError
from placement_rl.graph import capture, tp_detect
from placement_rl.graph.spec import graph_from_spec
from placement_rl.graph.tp import check_degree
from placement_rl.graph.zoo import tiny

torch.set_num_threads(1)
VOCAB = 128
SIZES = {  # one layer (per side), hidden 64, 4 heads, vocabulary 128
    "bart": dict(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB, max_position_embeddings=256),
    "gemma2": dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   intermediate_size=128, vocab_size=VOCAB),
    "falcon": dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, new_decoder_architecture=True,
                   num_kv_heads=2, vocab_size=VOCAB),
}


@pytest.fixture(scope="module")
def hf_graph():
    """The graph of a ``SIZES`` model by name, captured once per module on first use."""
    pytest.importorskip("transformers")
    return cache(lambda name: graph_from_spec({"source": "hf", "model_type": name, "overrides": SIZES[name],
                                               "batch_size": 2, "seq_len": 16, "coarsen": {"enabled": False}}))


def vocab_nodes(graph) -> dict[str, str]:
    return {k: v for k, v in graph.meta["tp"]["nodes"].items() if v.startswith("vocab")}


def test_bart_vocab_embedding_is_the_word_table_not_the_larger_position_table(hf_graph):
    g = hf_graph("bart")
    embeds = [v for v in range(g.num_nodes) if g.op_types[v] == "embedding" and g.param_bytes[v] > 0]
    word = next(v for v in embeds if any(g.names[v] in t["nodes"] for t in g.meta["tied"]))
    assert max(g.param_bytes[v] for v in embeds) > g.param_bytes[word]  # the position tables have 258 rows
    assert [k for k, v in vocab_nodes(g).items() if v == "vocab_embedding"] == [g.names[word]]
    assert g.meta["tp"]["vocab"] == VOCAB and 258 not in g.meta["tp"]["divisors"]
    # with no LM head found, the table tied to the output projection is still taken, a position lookup never
    assert tp_detect._vocab_embedding(g, embeds, -1, None, 4.0) == word
    assert [tp_detect._from_positions(g, v) for v in embeds] == [v != word for v in embeds]


@pytest.mark.parametrize("name", ["bart", "gemma2"])
def test_head_behind_a_bias_or_softcapping_is_vocab_split(hf_graph, name):
    g = hf_graph(name)
    kinds = sorted(vocab_nodes(g).values())
    assert kinds == ["vocab_embedding", "vocab_head", "vocab_loss"]  # as for the zoo models
    head = next(k for k, v in vocab_nodes(g).items() if v == "vocab_head")
    assert g.op_types[g.index[head]] == "linear" and g.meta["tp"]["vocab"] == VOCAB
    loss = next(k for k, v in vocab_nodes(g).items() if v == "vocab_loss")
    assert g.meta["tp"]["ar_fwd"][loss] == 3 * 2 * 16 * 4  # parallel cross-entropy: 3 numbers per token
    between = {"bart": {"add"}, "gemma2": {"div", "tanh", "mul"}}[name]  # the ops crossed, now on sharded logits
    sharded = {g.op_types[g.index[k]] for k, v in g.meta["tp"]["nodes"].items() if v == "sharded"}
    assert between <= sharded


class TwoHeads(nn.Module):
    """Logits summed from two heads: the add's other input is as large as the logits, so it is not crossed."""

    def __init__(self):
        super().__init__()
        self.emb, self.a, self.b = nn.Embedding(12, 8), nn.Linear(8, 12), nn.Linear(8, 12)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        return nn.functional.cross_entropy((self.a(x) + self.b(x)).reshape(-1, 12), idx.reshape(-1))


def test_sum_of_two_heads_is_not_taken_for_a_head():
    g = capture.capture(TwoHeads(), (torch.randint(0, 12, (2, 4), generator=torch.Generator().manual_seed(0)),))
    assert "vocab_head" not in g.meta["tp"]["nodes"].values()


def test_falcon_kv_heads_refuse_a_tp_degree_not_dividing_them(hf_graph):
    g = hf_graph("falcon")
    assert g.meta["tp"]["heads"] == {"n_heads": 4, "n_kv_heads": 2}
    check_degree(g, 2)
    with pytest.raises(PlanError, match="TP degree 4 does not divide n_kv_heads=2 .*choose a TP degree dividing 2"):
        check_degree(g, 4)


def test_multi_query_falcon_records_one_kv_head():
    pytest.importorskip("transformers")
    from placement_rl.graph.models.hf_config import kv_heads, load_config

    old = dict(SIZES["falcon"], new_decoder_architecture=False)
    assert kv_heads(load_config(None, "falcon", dict(old, multi_query=True))) == 1
    assert kv_heads(load_config(None, "falcon", dict(old, multi_query=False))) == 4
    assert kv_heads(load_config(None, "llama", {"num_key_value_heads": 2})) == 2


ZOO = {  # kinds per node count, the vocab nodes, the vocabulary, pairs, divisors and heads as detected before
    "gpt": ({"column": 4, "row": 4, "sharded": 35}, "linear_8", 4, [4, 12, 97, 128], {"n_heads": 4}),
    "llama_hf": ({"column": 10, "row": 4, "sharded": 80}, "linear_14", 4, [2, 4, 64, 97],
                 {"n_heads": 4, "n_kv_heads": 2}),
    "mixtral_hf": ({"column": 6, "row": 2, "sharded": 76}, "linear_10", 2, [2, 4, 97], {"n_heads": 4, "n_kv_heads": 2}),
    "opt_hf": ({"column": 8, "row": 4, "sharded": 40}, "linear_12", 4, [4, 97, 128], {"n_heads": 4}),
    "bert_hf": ({"column": 8, "row": 4, "sharded": 35}, "linear_13", 4, [4, 97, 128], {"n_heads": 4}),
    "moe": ({"column": 10, "row": 10, "sharded": 41}, "linear_22", 10, [4, 12, 97, 128], {"n_heads": 4}),
    "nmt": ({"sharded": 1}, "linear_1", 0, [97], {}),
}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_annotations_unchanged(name):
    if name.endswith("_hf"):
        pytest.importorskip("transformers")
    counts, head, pairs, divisors, heads = ZOO[name]
    tp = capture.capture_zoo(name, **tiny(name)).meta["tp"]
    vocab = {"embedding": "vocab_embedding", head: "vocab_head", "cross_entropy_loss": "vocab_loss"}
    assert {k: v for k, v in tp["nodes"].items() if v.startswith("vocab")} == vocab
    assert dict(Counter(v for v in tp["nodes"].values() if not v.startswith("vocab"))) == counts
    assert (tp["vocab"], len(tp["pairs"]), tp["divisors"], tp["heads"]) == (97, pairs, divisors, heads)
