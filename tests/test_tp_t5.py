"""T5 at TP 2: its word table, shared by the encoder's and the decoder's lookups and tied to the LM head, is split by
vocabulary at both lookups (it was refused: the decoder's lookup was left whole), and its cross-attention, which adds
a replicated per-head position bias ``(1, heads, q, k)`` to the scores, runs on each rank's local heads with the
bias cut to them (it took the DTensor path). A per-head bias that needs a gradient is not cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.executor._tp_region import LocalSlice, column_groups, local_region, local_regions, node_kinds
from placement_rl.executor.distributed import (DeployConfig, DeploySpec, deploy_stage_plans, export_step,
                                               prepare_job, program_module, reference_step)
from placement_rl.graph.capture import capture
from placement_rl.plans import StagePlan

torch.set_num_threads(1)
VOCAB, SEQ = 64, 8


class BiasedAttn(nn.Module):
    """Eager attention (separate q / k / v) adding a per-head bias to its scores: a constant that differs per head
    (grad-free, as T5's cross-attention bias), or one given as a floating-point input (``bias``: as a later
    pipeline stage receives an activation, it may need its gradient)."""

    def __init__(self, d: int = 32, h: int = 4) -> None:
        super().__init__()
        self.h = h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.h, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        # a pattern over the keys that differs per head (one differing by a constant leaves the softmax as it is)
        per_head = torch.arange(self.h * t, dtype=x.dtype).view(1, self.h, 1, t).cos() if bias is None else bias
        scores = q @ k.transpose(-1, -2) + per_head.expand(1, self.h, t, t)
        a = F.softmax(scores, dim=-1) @ v
        return self.o(a.transpose(1, 2).reshape(b, t, d)).square().mean()


def biased():
    torch.manual_seed(0)
    return BiasedAttn(), (torch.randn(4, 6, 32),)


def t5():
    """A 2 + 2-layer T5 (4 heads, vocabulary 64) as a loss step, with real weights, and its (ids, labels)."""
    transformers = pytest.importorskip("transformers")
    from placement_rl.graph.models.hf_auto import LossStep

    torch.manual_seed(0)
    cfg = transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=8,
                                vocab_size=VOCAB, dropout_rate=0.0, decoder_start_token_id=0, use_cache=False)
    model = transformers.T5ForConditionalGeneration._from_config(cfg, attn_implementation="eager")
    model.train()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    return LossStep(model, "seq2seq_lm"), (ids, ids.clone())


class SharedTable(nn.Module):
    """An encoder-decoder's word table in small: one table looked up for the source and the target, tied to the LM
    head, one MLP block between."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb, self.up, self.down = nn.Embedding(VOCAB, d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.emb(src).mean(1, keepdim=True) + self.emb(tgt)
        x = x + self.down(F.gelu(self.up(x)))
        return F.cross_entropy(self.head(x).reshape(-1, VOCAB), tgt.reshape(-1))


def shared():
    torch.manual_seed(0)
    return SharedTable(), tuple(torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(i))
                                for i in (1, 2))


def whole(g) -> StagePlan:
    return StagePlan(np.zeros(g.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,))


def test_a_grad_free_per_head_bias_is_cut_to_the_local_heads():
    for given in (False, True):
        m, inputs = biased()
        inputs += (torch.randn(1, 4, 1, 6),) if given else ()
        g = capture(m, inputs, name="biased")
        gm, kinds = program_module(export_step(m, list(inputs))), node_kinds(g)
        [cols] = column_groups(gm, kinds)
        got = local_region(gm, cols, kinds, 2)
        if given:  # each rank would get its heads' share of the bias gradient only: the DTensor path stays
            assert got is None
            continue
        cuts = [a for args in got[0].values() for a in args if isinstance(a, LocalSlice)]
        assert len(cuts) == 1 and cuts[0].dim == 1  # the (1, heads, t, t) bias, cut along its heads


def test_a_word_table_looked_up_twice_is_split_at_both_lookups(tmp_path):
    """Detection annotates one lookup; the executor splits the other too (it was refused: 'shares its weight with
    embedding_1, which TP does not split by vocabulary')."""
    m, inputs = shared()
    g = capture(m, inputs, name="shared")
    [tie] = g.meta["tied"]
    assert [node_kinds(g).get(u) for u in tie["nodes"]] == ["vocab_embedding", "vocab_embedding", "vocab_head"]
    prepare_job([DeploySpec(plan=whole(g), graph=g, module=m, inputs=inputs)], job_dir=tmp_path / "job")


@pytest.mark.slow
def test_t5_shared_word_table_is_split_at_both_lookups_and_its_attention_runs_on_local_heads(tmp_path):
    m, inputs = t5()
    g = capture(m, inputs, name="t5")
    kinds = node_kinds(g)
    [tie] = g.meta["tied"]  # the word table: encoder lookup, decoder lookup, LM head
    assert [kinds.get(u) for u in tie["nodes"]] == ["vocab_embedding", "vocab_embedding", "vocab_head"]
    gm = program_module(export_step(m, list(inputs)))
    groups = column_groups(gm, kinds)
    assert len(groups) == 6 and set(local_regions(gm, kinds, 2)) == {c.name for cols in groups for c in cols}
    prepare_job([DeploySpec(plan=whole(g), graph=g, module=m, inputs=inputs)], job_dir=tmp_path / "job")


@pytest.mark.slow
@pytest.mark.distributed
def test_t5_and_a_per_head_bias_at_tp2_gradients_equal_one_process():
    """T5 (2 + 2 layers), the per-head bias block and the shared word table at TP 2 on gloo in one launch: loss and
    gradients equal one process."""
    builders = (t5, biased, shared)
    specs = []
    for build in builders:
        m, inputs = build()
        g = capture(m, inputs, name=build.__name__)
        specs.append(DeploySpec(plan=whole(g), graph=g, module=m, inputs=inputs))
    results = deploy_stage_plans(specs, config=DeployConfig(steps=1, warmup=0, collect_grads=True, device="cpu",
                                                            timeout_s=300))
    for build, res in zip(builders, results):
        loss, grads = reference_step(*build(), chunks=1)
        assert res.tp == 2 and res.losses[0] == pytest.approx(loss, abs=1e-5) and set(res.grads) == set(grads)
        for key, ref in grads.items():
            torch.testing.assert_close(res.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
