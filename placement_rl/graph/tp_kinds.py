"""The per-node kinds of a tensor-parallel annotation (``graph.meta["tp"]``, ``placement_rl.graph.tp_detect``) and
its schema version: constants the graph's own checks read."""

KINDS = ("replicated", "column", "row", "sharded", "vocab_embedding", "vocab_head", "vocab_loss")
REPLICATED, COLUMN, ROW, SHARDED, VOCAB_EMB, VOCAB_HEAD, VOCAB_LOSS = range(len(KINDS))
SCHEMA_VERSION = 1
