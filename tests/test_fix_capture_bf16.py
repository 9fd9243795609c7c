"""A bf16 model whose loss upcasts its logits to fp32 is captured (and priced) as the bf16 model it is."""

import torch

from placement_rl.graph.capture import capture

torch.set_num_threads(1)


class _TinyLM(torch.nn.Module):
    """Embedding, two bf16 blocks and an LM head whose logits and cross-entropy run in fp32, as the HF heads do."""

    def __init__(self, vocab: int = 4096, d: int = 64):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.body = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids, labels):
        logits = self.head(self.body(self.emb(ids))).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def test_a_bf16_model_whose_head_upcasts_its_logits_is_captured_in_bf16():
    """By bytes, the fp32 logits and cross-entropy outweighed every bf16 activation, so the graph had no dtype and
    was priced in fp32 (1.4-2.2x slow on the zoo's HF models); the GEMMs run in bf16 and decide it."""
    torch.manual_seed(0)
    ids = torch.randint(0, 4096, (2, 64))
    g = capture(_TinyLM().to(torch.bfloat16), (ids, ids))
    assert g.meta.get("dtype") == "bf16" and "param_dtype" not in g.meta
    assert "dtype" not in capture(_TinyLM(), (ids, ids)).meta  # the fp32 model stays fp32
