"""Structured configs: one dataclass per CLI command and per config group, the single definition of every field's
type, range, choices and default (Hydra's ConfigStore holds them as ``schema/<name>``).

* A field is declared with ``opt(default, low=..., high=..., choices=..., null=..., doc=...)``: its annotation is
  the type, ``low`` / ``high`` (``open_low``: strictly above) bound a number, ``choices`` (names, or a function
  giving them) bound a string or a list's items, ``null`` allows None. ``constructive(name, ...)`` declares a field
  of ``AgentConfig`` whose default is ``ConstructiveConfig``'s field ``name`` (defined there, once).
* ``keys_of(cls)`` derives the flat ``{dotted key: schema.Key}`` table that ``placement_rl.cli.schema`` checks a
  composed config against (one line naming the key and what it accepts, exit code 2), so no range is written
  twice; ``defaults_of(cls)`` gives the flat defaults.
* ``register_configs()`` stores the dataclasses in Hydra's ConfigStore (``schema/<name>``, typed) and each
  command's defaults as ``base/<command>``; the command YAML files of ``BASED`` commands compose on that node
  (``- base/<command>@_here_``) and only pick the group presets. ``conf/train.yaml`` still spells its values out
  (other code composes it without the CLI); ``tests/test_config_defaults.py`` finds every value a command YAML
  sets equal to its dataclass default and every key it sets declared here. The group YAML files
  (``conf/graph/gpt.yaml`` ...) are presets over the group dataclasses: they may set any declared field, checked
  against its type and range.
* ``recipe_differences()`` compares the shipped training recipe (``placement-rl train trainer=pretrain``) with the
  Python defaults (``ConstructiveConfig()``, ``PretrainSpec()``) field by field.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from placement_rl.cli.keys import Choices, Key, WorkersKey, group_options

# the most seconds a wall-clock key takes (about 32 years: no run is longer, and a larger value overflowed waits
# that take a timeout: a process group's takes up to about 1e14 s, a thread's about 9e9 s)
MAX_SECONDS = 1e9


def _meta(*, low: float | None = None, high: float | None = None, open_low: bool = False,
          choices: Choices | None = None, null: bool = False, doc: str = "") -> dict[str, Any]:
    return {"low": low, "high": high, "open_low": open_low, "choices": choices, "null": null, "doc": doc}


def opt(default: Any, **meta: Any) -> Any:
    """A config field: its default and the range / choices a value must fit (``_meta``'s keywords; ``doc``: what it
    means)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=_meta(**meta))
    return field(default=default, metadata=_meta(**meta))


def _constructive_default(name: str) -> Any:
    from placement_rl.agents.constructive_config import ConstructiveConfig

    return next(f.default for f in dataclasses.fields(ConstructiveConfig) if f.name == name)


def constructive(name: str, **meta: Any) -> Any:
    """A field of ``AgentConfig`` whose default is ``ConstructiveConfig``'s field ``name`` (the one definition of
    the constructive policy's defaults; read when a default is asked for, so that a command's start-up does not
    import the agents and torch). ``meta``: as ``opt``'s."""
    return field(default_factory=functools.partial(_constructive_default, name), metadata=_meta(**meta))


# ---------------------------------------------------------------------------------------------- choices
def _zoo_names() -> list[str]:
    from placement_rl.graph import zoo

    return zoo.names()


def _families() -> list[str]:
    from placement_rl.graph import synthetic

    return synthetic.families()


def _placers() -> list[str]:
    from placement_rl import baselines

    return baselines.names() + baselines.pipeline_names()


def _encoders() -> list[str]:
    return group_options("encoder")


# ----------------------------------------------------------------------------------------------- groups
@dataclass
class CoarsenConfig:
    enabled: bool = opt(True, doc="coarsen the captured graph (placement_rl.graph.coarsen)")
    depth: Optional[int] = opt(None, low=1, null=True, doc="module-path depth of the groups (null: automatic)")
    max_nodes: Optional[int] = opt(None, low=1, null=True, doc="coarsen further until at most this many nodes")


@dataclass
class GraphConfig:
    """``graph=<preset>``: a zoo model, a synthetic family, a Hugging Face config, or ``graph.path``."""

    path: Optional[str] = opt(None, null=True, doc="a graph JSON file; overrides the zoo / synthetic choice")
    source: str = opt("zoo", choices=("zoo", "synthetic", "hf"))
    name: Optional[str] = opt(None, null=True, doc="zoo model (source=zoo)")
    overrides: Optional[dict] = opt(None, null=True, doc="the model's options (+graph.overrides.n_layers=12)")
    config: Optional[str] = opt(None, null=True, doc="graph=hf: a transformers config.json")
    model_type: Optional[str] = opt(None, null=True, doc="graph=hf: the library's default config of this type")
    task: str = opt("auto", choices=("auto", "causal_lm", "masked_lm", "seq2seq_lm", "image_classification"))
    batch_size: int = opt(1, low=1)
    seq_len: int = opt(128, low=1)
    attention: str = opt("eager", choices=("eager", "sdpa"))
    family: Optional[str] = opt(None, choices=_families, doc="source=synthetic: the DAG family")
    num_nodes: int = opt(100, low=3, high=1_000_000)
    seed: int = opt(0, low=0)
    coarsen: CoarsenConfig = field(default_factory=CoarsenConfig)


@dataclass
class TopologyConfig:
    """``topology=<preset>`` (the preset's YAML content: devices, links, ...) or ``topology.path``."""

    path: Optional[str] = opt(None, null=True, doc="a topology YAML file")
    detect: bool = opt(False, doc="detect this machine (topology=local)")


@dataclass
class EnvOptions:
    max_devices: Optional[int] = opt(None, low=1, null=True)
    reward: Optional[str] = opt(None, doc="the env's reward (incremental | final for env=placement)")
    initial_placement: Optional[str] = opt(None)


@dataclass
class EnvConfig:
    id: str = opt("placement_rl/ConstructivePlacementEnv-v0")
    options: EnvOptions = field(default_factory=EnvOptions)


@dataclass
class ReinforceOptions:
    learning_rate: float = opt(0.003, low=0, open_low=True)
    batch_episodes: int = opt(8, low=1)
    entropy_coef: float = opt(0.01, low=0)
    baseline_decay: float = opt(0.9, low=0, high=1)
    max_grad_norm: float = opt(1.0, low=0, open_low=True)


@dataclass
class AgentConfig:
    """``agent=<preset>``: the SB3 agents' fields and the constructive policy's. A group's presets
    (``conf/agent/*.yaml``) set the values; a default here is what a preset that leaves a field out would compose to:
    the SB3 fields' are ``agent=ppo``'s; the constructive ones' are ``ConstructiveConfig``'s (the Python API's, which
    are the pretraining recipe), read from it by ``constructive`` (``ent_coef``, which both read, included), except
    the windows' (null: the checkpoint's) and the two keys only the CLI reads (``equal_seconds``,
    ``search_budget``). ``agent=constructive`` sets the fine-tuning values (``rl_algo=sil``, ...) that
    ``trainer=pretrain`` sets back."""

    algo: str = opt("constructive")
    # stable-baselines3 (ppo, maskable_ppo) and REINFORCE
    learning_rate: float = opt(0.001, low=0, open_low=True)
    n_envs: int = opt(16, low=1)
    n_steps: int = opt(32, low=1)
    batch_size: int = opt(256, low=1)
    n_epochs: int = opt(2, low=1)
    gamma: float = opt(0.9, low=0, high=1)
    gae_lambda: float = opt(0.95, low=0, high=1)
    ent_coef: float = constructive("ent_coef", low=0, doc="agent=ppo / maskable_ppo set 0.2")
    clip_range: float = opt(0.2, low=0, high=1, open_low=True)
    reinforce: ReinforceOptions = field(default_factory=ReinforceOptions)
    # the constructive policy (placement_rl.agents.constructive_config.ConstructiveConfig)
    lr: float = constructive("lr", low=0, open_low=True)
    bc_epochs: int = constructive("bc_epochs", low=0)
    dagger_rounds: int = constructive("dagger_rounds", low=0)
    rl_algo: str = constructive("rl_algo", choices=("sil", "ppo", "q"))
    rl_lr: float = constructive("rl_lr", low=0, open_low=True)
    rl_iters: int = constructive("rl_iters", low=0)
    temperature: float = constructive("temperature", low=0, open_low=True)
    tasks_per_iter: int = constructive("tasks_per_iter", low=1)
    samples: int = constructive("samples", low=1)
    ppo_epochs: int = constructive("ppo_epochs", low=1)
    clip: float = constructive("clip", low=0, high=1, open_low=True)
    sil_coef: float = constructive("sil_coef", low=0)
    regret_coef: float = constructive("regret_coef", low=0)
    teacher_search: int = constructive("teacher_search", low=0)
    window: Optional[int] = opt(None, low=0, null=True)
    full_window: Optional[int] = opt(None, low=0, null=True)
    full_window_train: Optional[bool] = opt(None, null=True)
    pi_rounds: int = constructive("pi_rounds", low=0)
    pi_epochs: int = constructive("pi_epochs", low=0)
    pi_lr: float = constructive("pi_lr", low=0)
    pi_label_every: int = constructive("pi_label_every", low=1)
    pi_max_nodes: int = constructive("pi_max_nodes", low=1)
    pi_max_labels: int = constructive("pi_max_labels", low=1)
    ei_rounds: int = constructive("ei_rounds", low=0)
    ei_search_budget: int = constructive("ei_search_budget", low=0)
    ei_epochs: int = constructive("ei_epochs", low=0)
    ei_lr: float = constructive("ei_lr", low=0)
    ei_max_nodes: int = constructive("ei_max_nodes", low=1)
    ft_search_rounds: int = constructive("ft_search_rounds", low=0,
                                         doc="fine-tuning: rounds of search from the policy's placements")
    ft_search_seconds: float = constructive("ft_search_seconds", low=0, open_low=True, high=MAX_SECONDS,
                                            doc="fine-tuning: wall-clock seconds of one round's search")
    equal_seconds: bool = opt(True, doc="fine-tuning: also run the searches at the learned rows' seconds")
    clone_epochs: int = constructive("clone_epochs", low=0)
    clone_lr: float = constructive("clone_lr", low=0, open_low=True,
                                   doc="fine-tuning: the learning rate of cloning a round's placement")
    pi_max_completions: int = constructive("pi_max_completions", low=0)
    eval_every: int = constructive("eval_every", low=1)
    eval_samples: int = constructive("eval_samples", low=0)
    search_budget: int = opt(2000, low=0)


@dataclass
class EncoderConfig:
    name: str = opt("sage", choices=_encoders)
    hidden: int = opt(32, low=1)
    layers: int = opt(3, low=1)


@dataclass
class PretrainConfig:
    """``trainer=pretrain``'s task distribution (``placement_rl.studies.pretrain.PretrainSpec``); the defaults are
    ``conf/trainer/pretrain.yaml``'s (the recipe)."""

    train_tasks: int = opt(300, low=1)
    val_tasks: int = opt(48, low=0)
    sizes: list = opt([16, 1000], doc="smallest and largest task graph (nodes)")
    devices: list = opt([2, 16], doc="fewest and most devices of a task's cluster")
    zoo_frac: float = opt(0.15, low=0, high=1)
    dev: bool = opt(True, doc="zero-shot on the dev split at the end")
    seed: int = opt(0, low=0)
    cache: Optional[str] = opt(None, null=True)


@dataclass
class FamilyConfig:
    """``trainer=family``: one policy over a family of graphs and topologies, zero-shot on held-out pairs."""

    synthetic: list = opt(["layered", "series_parallel", "transformer_like", "cnn_like"])
    synthetic_per_family: int = opt(8, low=1)
    num_nodes: list = opt([16, 48], doc="smallest and largest synthetic graph (nodes)")
    zoo: list = opt(["gpt", "resnet18", "inception"])
    topologies: list = opt(["4x_v100_nvlink", "2x_k80"])
    held_out: list = opt(["nmt", "moe", "resnet50", "synthetic:layered:120:7"])
    held_out_topologies: list = opt(["4x_v100_pcie", "8x_a100_nvswitch"])
    initial_placement: str = opt("best_single")


@dataclass
class TrainerConfig:
    total_steps: int = opt(30000, low=0)
    eval_samples: int = opt(8, low=0)
    compare: bool = opt(False)
    tensorboard: bool = opt(True)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    family: FamilyConfig = field(default_factory=FamilyConfig)


GROUP_SCHEMAS: dict[str, type] = {"graph": GraphConfig, "topology": TopologyConfig, "env": EnvConfig,
                                  "agent": AgentConfig, "encoder": EncoderConfig, "trainer": TrainerConfig}


# --------------------------------------------------------------------------------------------- commands
@dataclass
class CostsConfig:
    path: Optional[str] = opt(None, null=True, doc="measured costs: a costs file (placement_rl.cost.costs_file) or "
                                                   "a `placement-rl profile` file")


@dataclass
class RayConfig:
    address: Optional[str] = opt(None, null=True, doc="null: a local Ray instance; auto or host:port: join a "
                                                      "running cluster")


@dataclass
class InspectConfig:
    pass


@dataclass
class EvaluateConfig:
    costs: CostsConfig = field(default_factory=CostsConfig)
    mode: str = opt("train", choices=("train", "inference"), doc="inference: forward only")
    objective: str = opt("step", choices=("step", "throughput"), doc="throughput: steady-state time per batch")
    suite: str = opt("default", choices=("default", "single"))
    budget: int = opt(5000, low=1, doc="simulator calls per placer (heuristics use fewer; searches use all)")
    seconds: Optional[float] = opt(None, low=0, open_low=True, high=MAX_SECONDS, null=True,
                                   doc="wall-clock seconds per placer and stage planner as well (searches stop at "
                                       "whichever of calls and seconds ends first: raise budget to compare at equal "
                                       "seconds; pp_exhaustive cut short is a note)")
    seed: int = opt(0, low=0)
    placers: Optional[list] = opt(None, low=1, choices=_placers, null=True, doc="placer names; null = all")
    pipeline: bool = opt(True, doc="also run the pipeline partitioners")
    num_microbatches: int = opt(4, low=1)
    plan: Optional[str] = opt(None, null=True, doc="a placement.json or plan.json to score as well, on the "
                                 "graph.json beside it and the topology preset it names unless graph / topology "
                                 "are given")
    progress: bool = opt(True)


@dataclass
class TrainConfig:
    costs: CostsConfig = field(default_factory=CostsConfig)
    seed: int = opt(0, low=0)
    checkpoint: Optional[str] = opt(None, null=True, doc="env=constructive: the policy to fine-tune (null: the "
                                                        "packaged pretrained one); else resume")
    strict_checkpoint: bool = opt(False, doc="refuse a checkpoint whose code hashes differ from this code's")
    progress: bool = opt(True)
    workers: Any = opt("auto", doc="an integer >= 1 or auto (every core, on Ray)")
    ray: RayConfig = field(default_factory=RayConfig)
    resume: bool = opt(False, doc="trainer=pretrain: continue the run in hydra.run.dir from its last phase")


@dataclass
class PlaceConfig:
    costs: CostsConfig = field(default_factory=CostsConfig)
    checkpoint: Optional[str] = opt(None, null=True, doc="null: the pretrained policy shipped with the package")
    strict_checkpoint: bool = opt(False, doc="refuse a checkpoint whose code hashes differ from this code's")
    decode: str = opt("one_pass", choices=("one_pass", "sequential"))
    samples: int = opt(16, low=0)
    window: Optional[int] = opt(None, low=0, null=True, doc="lookahead window W (null: the checkpoint's)")
    full_window: Optional[int] = opt(None, low=0, null=True, doc="graphs of at most this many nodes read the whole "
                                                                "rest of the graph (null: the checkpoint's)")
    search_budget: int = opt(0, low=0, doc="> 0: local search from the best learned placement")
    search_seconds: float = opt(0.0, low=0, high=MAX_SECONDS,
                                doc="> 0: policy_search (the policy's repairs inside simulated annealing) from the plan "
                                    "(greedy and samples' best) for that many seconds, anytime, and with compare "
                                    "the searches a user would run instead at the same seconds")
    bound_seconds: float = opt(0.0, low=0, high=MAX_SECONDS,
                               doc="> 0: CP-SAT tightens the lower bound for that long (OR-Tools: "
                                   "placement-rl[exact]; near the optimum up to ~100 nodes)")
    seed: int = opt(0, low=0)
    compare: bool = opt(True, doc="baselines with the same simulator-call budget -> comparison.md")
    progress: bool = opt(True)


@dataclass
class ProfileConfig:
    devices: Optional[list] = opt(None, low=1, null=True, doc="local device names; null = all")
    warmup: int = opt(3, low=0)
    repeats: int = opt(10, low=1)
    links: bool = opt(True)
    processes: bool = opt(True)
    threads: Optional[int] = opt(1, low=1, null=True)
    output: Optional[str] = opt(None, null=True, doc="ProfileDB path; null = <run dir>/profile.json")
    measurements: Optional[str] = opt(None, null=True, doc="a public GPU measurement file to import instead")
    progress: bool = opt(True)


@dataclass
class DeployConfig:
    costs: CostsConfig = field(default_factory=CostsConfig)
    plan: str = opt("???", doc="a plan.json (DP x PP) or placement.json")
    profile: Optional[str] = opt(None, null=True, doc="a ProfileDB for the prediction; null = the cost model: "
                                 "calibrated for GPUs (roofline if the topology sets cost_model: roofline), "
                                 "roofline for CPUs")
    steps: int = opt(5, low=1)
    warmup: int = opt(1, low=0)
    lr: float = opt(0.001, low=0, open_low=True)
    device: str = opt("auto", choices=("auto", "cpu", "cuda"))
    timeout_s: float = opt(300, low=0, open_low=True, high=MAX_SECONDS)
    threads: int = opt(1, low=1)
    nnodes: int = opt(1, low=1)
    node_rank: Optional[int] = opt(None, low=0, null=True)
    rdzv_endpoint: Optional[str] = opt(None, null=True)


COMMAND_SCHEMAS: dict[str, type] = {"inspect": InspectConfig, "evaluate": EvaluateConfig, "train": TrainConfig,
                                    "place": PlaceConfig, "profile": ProfileConfig, "deploy": DeployConfig}
SPECIAL_KEYS = {"workers": WorkersKey(int)}  # a value of two kinds (an integer or auto)


# ------------------------------------------------------------------------------------------- deriving
def _kind(annotation: Any) -> tuple[type, bool]:
    """(int / float / bool / str / list / dict, whether Optional) of a field's annotation."""
    tp = annotation
    args = typing.get_args(tp)
    optional = type(None) in args
    if optional:
        tp = next(a for a in args if a is not type(None))
    origin = typing.get_origin(tp) or tp
    return (origin if origin in (int, float, bool, str, list, dict) else object), optional


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def keys_of(cls: type, prefix: str = "") -> dict[str, Key]:
    """The flat ``{dotted key: Key}`` table of a config dataclass (nested dataclasses become dotted keys)."""
    out: dict[str, Key] = {}
    for f, hint in _fields(cls):
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            out.update(keys_of(hint, name + "."))
            continue
        if name in SPECIAL_KEYS:
            out[name] = SPECIAL_KEYS[name]
            continue
        kind, _ = _kind(hint)
        if kind is object:
            continue
        m = f.metadata
        out[name] = Key(kind, low=m.get("low"), high=m.get("high"), open_low=bool(m.get("open_low")),
                        choices=m.get("choices"), null=bool(m.get("null")))
    return out


def defaults_of(cls: type, prefix: str = "") -> dict[str, Any]:
    """The flat ``{dotted key: default}`` of a config dataclass."""
    out: dict[str, Any] = {}
    inst = cls()
    for f, hint in _fields(cls):
        name = f"{prefix}{f.name}"
        value = getattr(inst, f.name)
        if dataclasses.is_dataclass(hint):
            out.update(defaults_of(hint, name + "."))
        else:
            out[name] = value
    return out


# commands whose YAML takes its values from the dataclass (``- base/<command>@_here_`` first in its defaults list)
BASED = ("evaluate", "place", "profile", "deploy")


def register_configs(command: str | None = None) -> None:
    """Store the dataclasses in Hydra's ConfigStore: typed, as ``schema/<command>`` and ``schema/<group>``, and each
    command's defaults as ``base/<command>`` (plain values: what the command YAML composes on; a typed node there
    would make Hydra refuse a wrong value before ``placement_rl.cli.schema`` names the key and what it takes).
    ``command``: only that command's two nodes (what the CLI registers: Hydra deep-copies the whole store on every
    lookup of a group's options, so every node stored costs start-up time; measured: all nineteen typed nodes took
    ``placement-rl inspect --help`` from 1.4 to 3.0 s of CPU)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    schemas = {**COMMAND_SCHEMAS, **GROUP_SCHEMAS} if command is None else {command: COMMAND_SCHEMAS[command]}
    for name, cls in schemas.items():
        cs.store(group="schema", name=name, node=cls)
    for name in BASED if command is None else [c for c in BASED if c == command]:
        cs.store(group="base", name=name, node=OmegaConf.create(OmegaConf.to_container(
            OmegaConf.structured(COMMAND_SCHEMAS[name]))))


# --------------------------------------------------------------------------------------------- recipe
def recipe_differences(overrides: Sequence[str] = ("trainer=pretrain",)) -> dict[str, tuple[Any, Any]]:
    """``{field: (the CLI recipe's value, the Python default)}`` for every field of ``ConstructiveConfig`` the
    composed ``placement-rl train <overrides>`` config's ``agent`` / ``encoder`` groups set and every field of
    ``PretrainSpec`` its ``trainer.pretrain`` sets, where the two differ (null in the recipe: decided elsewhere,
    e.g. by the checkpoint, and left out). Empty: ``pretrain(PretrainSpec(), ConstructiveConfig())`` from Python
    runs the recipe the CLI runs."""
    from placement_rl.agents.constructive_config import ConstructiveConfig
    from placement_rl.studies.config import compose_train
    from placement_rl.studies.pretrain import PretrainSpec

    cfg, _ = compose_train(list(overrides))
    recipe = {**{k: v for k, v in cfg.get("agent", {}).items()}, **dict(cfg.get("encoder", {}))}
    recipe["encoder"] = recipe.pop("name", None)
    out: dict[str, tuple[Any, Any]] = {}
    for obj, values in ((ConstructiveConfig(), recipe), (PretrainSpec(), cfg.get("trainer", {}).get("pretrain", {}))):
        for f in dataclasses.fields(obj):
            if f.name in values and values[f.name] is not None:
                want, have = values[f.name], getattr(obj, f.name)
                if (list(want) if isinstance(want, (list, tuple)) else want) != \
                        (list(have) if isinstance(have, (list, tuple)) else have):
                    out[f"{type(obj).__name__}.{f.name}"] = (want, have)
    return out
