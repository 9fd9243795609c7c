"""The vocab-parallel embedding is the word table, not a position table with more rows than the vocabulary
(character-level models with learned positions): tied to the LM head, or, untied, the table with the head's
vocabulary as rows. At TP 2 the tied word table then keeps its lookup's gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from placement_rl.executor.distributed import DeployConfig, DeploySpec, deploy_stage_plans, reference_step
from placement_rl.graph.capture import capture
from placement_rl.plans import StagePlan

torch.set_num_threads(1)
VOCAB, MAX_POS, SEQ, D = 12, 40, 8, 16  # the position table (40 rows) is larger than the vocabulary (12)


class CharLM(nn.Module):
    """Token and learned position embeddings, one MLP block, an LM head (tied to the token table or not)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.norm, self.up, self.down = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        x = x + self.down(F.gelu(self.up(self.norm(x))))
        return F.cross_entropy(self.head(x).reshape(-1, VOCAB), targets.reshape(-1))


def char_lm(tied: bool) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    module = CharLM(tied)
    g = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, VOCAB, (4, SEQ), generator=g) for _ in range(2))
    return module, (idx, targets)


def vocab_embedding(graph) -> list[str]:
    return [k for k, v in graph.meta["tp"]["nodes"].items() if v == "vocab_embedding"]


@pytest.mark.parametrize("tied", [True, False])
def test_word_table_not_a_larger_position_table_is_the_vocab_embedding(tied):
    module, inputs = char_lm(tied)
    graph = capture(module, inputs, name="char_lm")
    calls = [graph.names[v] for v in range(graph.num_nodes) if "embedding" in graph.op_types[v]]
    assert len(calls) == 2 and graph.meta["tp"]["vocab"] == VOCAB
    assert vocab_embedding(graph) == [calls[0]]  # the token lookup runs first, the position lookup second


@pytest.mark.slow
@pytest.mark.distributed
def test_tied_word_table_keeps_its_lookup_gradient_at_tp2():
    specs, plans = [], []
    for tied in (True, False):
        module, inputs = char_lm(tied)
        graph = capture(module, inputs, name="char_lm")
        plans.append(StagePlan(np.zeros(graph.num_nodes, dtype=np.int64), ((0, 1),), tp=(2,)))
        specs.append(DeploySpec(plan=plans[-1], graph=graph, module=module, inputs=inputs))
    results = deploy_stage_plans(specs, config=DeployConfig(device="cpu", steps=1, warmup=0, collect_grads=True,
                                                            timeout_s=120))
    for tied, res in zip((True, False), results):
        module, inputs = char_lm(tied)
        loss, grads = reference_step(module, inputs, chunks=1)
        assert res.tp == 2 and res.losses[0] == pytest.approx(loss, abs=1e-5) and set(res.grads) == set(grads)
        for key, ref in grads.items():
            torch.testing.assert_close(res.grads[key], ref, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
