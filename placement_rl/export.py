"""A ``StagePlan`` handed to the trainers people run: torchtitan's job config and Megatron-LM's arguments, and back.

``to_torchtitan(plan, graph) -> str`` writes the ``[parallelism]`` and ``[training]`` tables of a torchtitan job
config (TOML): ``data_parallel_replicate_degree`` / ``data_parallel_shard_degree`` (DDP or FSDP2 over the plan's DP
degree), ``tensor_parallel_degree``, ``pipeline_parallel_degree`` (device groups), ``pipeline_parallel_schedule`` by
name (``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``: torch's
``torch.distributed.pipelining`` names), ``pipeline_parallel_microbatch_size`` and ``module_fqns_per_model_part``
(the model's own module names per stage), ``local_batch_size`` / ``global_batch_size`` (a one-stage plan's
micro-batches as gradient-accumulation steps). Targets torchtitan's ``Parallelism`` / ``Training`` job-config fields
as of its 2025 releases (``module_fqns_per_model_part`` is the newest field used).

``to_megatron(plan, graph) -> str`` writes Megatron-LM ``pretrain_gpt.py`` arguments:
``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--pipeline-model-parallel-layout`` (the
uneven layer layout, one ``|``-separated entry per virtual stage in Megatron's order, virtual stage ``k`` on
pipeline rank ``k mod pp``: ``E`` embedding, ``t`` a transformer layer, ``L`` final norm, output layer and loss; the
virtual stages per rank follow from it), ``--micro-batch-size`` / ``--global-batch-size`` (gradient accumulation
when the plan's micro-batches exceed the pipeline's), ``--make-vocab-size-divisible-by``, ``--use-torch-fsdp2``
for FSDP plans and ``--untie-embeddings-and-output-weights`` when the output layer has weights of its own
(``untied_embeddings``; Megatron-LM ties them by default), and the model's own flags where the graph's metadata
records them (``_export_model.model_settings``: sizes, query groups, the Llama family's architecture, dropouts,
experts; a ``# note:`` names the ones it does not record). ``E`` is every module before the layers except a rotary
embedding (no weights; Megatron-LM computes it in every stage) and must sit whole in the first stage. A graph the
model's metadata calls no causal LM (BERT, ViT, T5) gets a ``# note:`` line: the settings are ``pretrain_gpt.py``'s.
Targets Megatron-LM / Megatron-Core 0.13 and later (the layout argument; experimental there).
Megatron runs 1F1B (interleaved with virtual stages) only: a ``gpipe`` or ``zb1p`` pipeline is refused (a one-stage
plan has no pipeline schedule and reads back as ``1f1b``). Recomputation (one setting for all stages: both
trainers set one): ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` (every
layer) or ``selective``; torchtitan ``[activation_checkpoint] mode`` (its ``selective`` is an op-level policy, close
to but not exactly the attention core). Sequence parallelism: ``--sequence-parallel``; torchtitan runs it with
every TP degree > 1 (written as a comment).

Stages are exported at module granularity: the transformer layers (the repeated ``<container>.<i>`` modules of
the captured graph's ``module_paths``) and the modules around them. A module whose nodes the plan puts in two
stages is refused (one line naming it) unless ``snap=True``, which moves it whole to the stage holding most of
its forward FLOPs; the header then names the modules moved and gives the snapped plan's predicted step time (the
topology's estimates, ``cost.resolve_costs``; needs ``topology``). An interleaved plan whose micro-batches do not
divide over its device groups is refused as the pipeline simulator refuses it.

Neither trainer's settings say which GPU runs which rank: both number ranks pipeline rank outermost, then DP, TP
innermost, and a launcher gives rank ``r`` the ``r``-th GPU it starts. A plan whose devices are not ``0..world-1``
in that order (stage 0 on an A100, stage 1 on the H100 ...) gets a ``# rank_devices = [...]`` line (the plan's
device of every rank), a ``# note:`` naming each rank's device and, with ``topology``, one ``# node k:`` line per
run of consecutive ranks on one host (the node order to launch the hosts in, its ``CUDA_VISIBLE_DEVICES``); a host
whose ranks are not consecutive gets a note of its own (torchrun cannot number them so).
``from_torchtitan`` / ``from_megatron`` read the text back into a ``StagePlan`` for the same
graph (the ``rank_devices`` line's devices, else ``0..world-1``, in the trainers' rank order; nodes outside every
module follow their inputs' latest stage, those without inputs their consumers' earliest): a plan cut so
round-trips exactly (tests).

A coarsened graph's stages hold its groups' members' modules (``placement_rl.export_modules``: a group named after
one module may hold the embedding or the final norm too), and its plans read back onto its groups.

The parts: ``placement_rl._export_layout`` (the plan at module granularity), ``_export_header`` (the comment lines
a config starts with), ``_export_torchtitan`` and ``_export_megatron`` (each trainer's settings, both ways) and
``_export_read`` (back to a plan); import them from here.
"""

from __future__ import annotations

from placement_rl._export_layout import Layout, layout, most_recompute, uniform_recompute
from placement_rl._export_megatron import from_megatron, to_megatron, untied_embeddings
from placement_rl._export_torchtitan import from_torchtitan, to_torchtitan
from placement_rl.errors import PlanError
from placement_rl.graph.ir import CompGraph
from placement_rl.graph.layers import Modules, modules
from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

FORMATS = ("torchtitan", "megatron")


def export_plan(plan: StagePlan, graph: CompGraph, fmt: str, *, snap: bool = False,
                topology: DeviceTopology | None = None, uniform: bool = False) -> str:
    """``to_torchtitan`` or ``to_megatron`` by name; ``uniform``: a plan whose stages recompute differently is
    exported with ``uniform_recompute`` (refused otherwise)."""
    if fmt not in FORMATS:
        raise PlanError(f"unknown export format '{fmt}' (choose one of {', '.join(FORMATS)})")
    if uniform:
        plan = uniform_recompute(plan)
    return (to_torchtitan if fmt == "torchtitan" else to_megatron)(plan, graph, snap=snap, topology=topology)


__all__ = ["FORMATS", "Layout", "Modules", "export_plan", "from_megatron", "from_torchtitan", "layout", "modules",
           "most_recompute", "to_megatron", "to_torchtitan", "uniform_recompute", "untied_embeddings"]
