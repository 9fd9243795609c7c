"""A vocab-parallel LM head whose logits go through an element-wise op before the loss (Gemma 2's softcapping,
BART's logits bias) is priced vocab-split but refused at deploy before any process: the executor's vocab-parallel
loss takes the head's output itself (the ranks failed; before detection crossed such ops the tied table's gradient
was wrong)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.errors import PlanError
from placement_rl.executor._tp_region import node_kinds
from placement_rl.executor.distributed import check_logits, export_step, program_module
from placement_rl.graph.capture import capture

torch.set_num_threads(1)


class LM(nn.Module):
    def __init__(self, softcap: bool) -> None:
        super().__init__()
        self.emb, self.norm, self.head, self.softcap = nn.Embedding(64, 32), nn.LayerNorm(32), nn.Linear(32, 64), softcap

    def forward(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.norm(self.emb(idx)))
        if self.softcap:
            logits = torch.tanh(logits / 30.0) * 30.0
        return F.cross_entropy(logits.view(-1, 64), tgt.view(-1))


@pytest.mark.parametrize("softcap", [True, False])
def test_a_head_behind_softcapping_is_refused_before_launch(softcap):
    m, inputs = LM(softcap), (torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))
    g = capture(m, inputs, name="lm")
    kinds = node_kinds(g)
    assert "vocab_head" in kinds.values()
    gm = program_module(export_step(m, list(inputs)))
    if not softcap:
        check_logits(gm, kinds)
        return
    with pytest.raises(PlanError, match="feeds its logits through .* before the loss.*use tp=1") as err:
        check_logits(gm, kinds)
    assert "\n" not in str(err.value)


class Tied(nn.Module):
    """A tied LM whose logits go through an op TP detection does not cross (the head is then not vocab-split)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm, self.head = nn.Embedding(64, 32), nn.LayerNorm(32), nn.Linear(32, 64, bias=False)
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)  # an MLP: a column -> row pair
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        x = x + self.fc2(torch.relu(self.fc1(self.norm(x))))
        logits = self.head(x)
        logits = logits - logits.logsumexp(-1, keepdim=True)
        return F.nll_loss(logits.view(-1, 64), tgt.view(-1))


def test_a_vocab_split_table_tied_to_an_unsplit_head_is_refused():
    from placement_rl.executor.distributed import check_ties

    m, inputs = Tied(), (torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))
    g = capture(m, inputs, name="tied")
    kinds = node_kinds(g)
    assert g.meta["tied"] and "vocab_head" not in kinds.values() and "vocab_embedding" in kinds.values()
    with pytest.raises(PlanError, match="shares its weight with .* does not split by vocabulary") as err:
        check_ties(g, kinds)
    assert "\n" not in str(err.value)
    m2, inputs2 = LM(False), (torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))
    check_ties(capture(m2, inputs2, name="lm"), node_kinds(capture(m2, inputs2, name="lm")))  # untied: nothing
