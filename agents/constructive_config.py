"""The constructive policy's configuration, construction and checkpoint loading.

``ConstructiveConfig`` (validated hyper-parameters and state windows), ``build_policy`` (a fresh ``DevicePolicy``
for a config), ``load_policy`` / ``default_checkpoint`` (``agents.checkpoint`` files with ``algo="constructive"``;
the shipped pretrained one). Training lives in ``agents.constructive_train``, which re-exports these.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement_rl.agents.checkpoint import load_checkpoint
from placement_rl.agents.constructive import FULL_WINDOW
from placement_rl.agents.device_policy import DevicePolicy
from placement_rl.envs.constructive_task import NUM_NODE_FEATURES
from placement_rl.cost.schedule import NUM_DEVICE_FEATURES
from placement_rl.cost.window import POLICY_WINDOW
from placement_rl.errors import CheckpointError, ConfigError

ALGO = "constructive"
RL_ALGOS = ("sil", "ppo", "q")


@dataclass(frozen=True, kw_only=True)
class ConstructiveConfig:
    """The constructive policy's hyper-parameters. The defaults are the shipped pretraining recipe
    (``placement-rl train trainer=pretrain``: conf/agent/constructive.yaml under conf/trainer/pretrain.yaml), so
    ``pretrain(PretrainSpec(), ConstructiveConfig())`` from Python trains what the command trains."""

    encoder: str = "sage"
    hidden: int = 64
    layers: int = 3
    lr: float = 1e-3  # imitation
    bc_epochs: int = 8
    dagger_rounds: int = 2
    rl_algo: str = "q"  # sil (self-imitation: clone the best placement sampled so far) | ppo | q (credit per decision)
    rl_lr: float = 1e-4
    rl_iters: int = 0
    temperature: float = 1.0  # sampling temperature of RL rollouts (2.0 was tried: too random over 200 decisions)
    tasks_per_iter: int = 8
    samples: int = 16
    ppo_epochs: int = 2
    clip: float = 0.2
    ent_coef: float = 0.003
    sil_coef: float = 0.5
    regret_coef: float = 1.0  # imitation of the lookahead teacher: weight of the expected regret (0: plain cloning)
    window: int = POLICY_WINDOW  # lookahead window W of the state's features (0: the node alone)
    full_window: int = FULL_WINDOW  # placing (not training): graphs of at most this many nodes read the whole rest
    full_window_train: bool = False  # ... and the training states too (the states recorded for imitation)
    teacher_search: int = 0  # > 0: clone the best teacher's placement refined by annealing with this many sim calls
    pi_rounds: int = 0  # approximate policy iteration: rounds of relabelling with the rollout over the student
    pi_epochs: int = 4  # distillation epochs per round
    pi_lr: float = 0.0  # learning rate of the distillation (0: the imitation rate ``lr``)
    pi_label_every: int = 4  # label every k-th state of the student's trajectory (the teacher costs D completions)
    pi_max_nodes: int = 1000  # tasks larger than this are not relabelled (the teacher is O(N^2 W D^2))
    pi_max_labels: int = 16  # at most this many labelled states per task and round (larger tasks: sparser labels)
    ei_rounds: int = 0  # expert iteration (agents.expert_iteration): rounds of multi-start search, then distillation
    ei_search_budget: int = 3000  # simulator calls of one task's multi-start search per round
    ei_epochs: int = 3  # distillation epochs per round
    ei_lr: float = 0.0  # distillation learning rate (0: ``lr``)
    ei_max_nodes: int = 1000  # tasks larger than this are not searched
    ft_search_rounds: int = 1  # fine-tuning: rounds of search from the policy's placements, cloned (stops at a stall)
    ft_search_seconds: float = 3.0  # fine-tuning: wall-clock seconds of one round's search
    clone_epochs: int = 400  # fine-tuning: at most this many epochs to clone a round's search or rollout placement
    clone_lr: float = 3e-3  # fine-tuning: the learning rate of that cloning
    pi_max_completions: int = 4000  # fine-tuning: no policy iteration where one round's N x D completions exceed this
    eval_every: int = 5
    eval_samples: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        for keys, rule, ok in RANGES:
            for key in keys:
                if not ok(getattr(self, key)):
                    raise FieldError(key, getattr(self, key), rule)
        if self.rl_algo not in RL_ALGOS:
            raise FieldError("rl_algo", self.rl_algo, f"one of {', '.join(RL_ALGOS)}")


class FieldError(ConfigError):
    """A ``ConstructiveConfig`` field out of its range (``key must be <rule>, got <value>``), with ``key``,
    ``value`` and ``rule`` apart: the command line names the key as it is typed there (``agent.<key>=<value>``)."""

    def __init__(self, key: str, value: Any, rule: str) -> None:
        super().__init__(f"{key} must be {rule}, got {value!r}")
        self.key, self.value, self.rule = key, value, rule


RANGES = (  # (fields, rule, check) of ``ConstructiveConfig``
    (("hidden", "layers", "samples", "tasks_per_iter", "ppo_epochs", "eval_every", "eval_samples", "pi_label_every",
      "pi_max_nodes", "pi_max_labels"), "an integer >= 1", lambda v: int(v) >= 1),
    (("bc_epochs", "dagger_rounds", "rl_iters", "window", "full_window", "pi_rounds", "pi_epochs", "teacher_search",
      "clone_epochs", "pi_max_completions", "ei_rounds", "ei_epochs", "ei_search_budget", "ei_max_nodes",
      "ft_search_rounds"), "an integer >= 0", lambda v: int(v) >= 0),
    (("regret_coef", "pi_lr", "ei_lr"), "a number >= 0", lambda v: float(v) >= 0),
    (("lr", "rl_lr", "temperature", "clone_lr", "ft_search_seconds"), "a number > 0", lambda v: float(v) > 0),
)


def build_policy(cfg: ConstructiveConfig) -> DevicePolicy:
    policy = DevicePolicy(node_dim=NUM_NODE_FEATURES, dev_dim=NUM_DEVICE_FEATURES, encoder=cfg.encoder,
                          hidden=cfg.hidden, layers=cfg.layers)
    set_windows(policy, cfg)
    return policy


def set_windows(policy: DevicePolicy, cfg: ConstructiveConfig) -> None:
    """The windows of the states ``policy`` reads (``agents.constructive.state_window``), from ``cfg``."""
    policy.window = int(cfg.window)  # the states it reads are built with this lookahead window
    policy.full_window = int(cfg.full_window)  # ... and, placing a graph this small, the whole rest of the graph
    policy.full_window_train = bool(cfg.full_window_train)  # ... training on such states as well


def _obs_dims() -> dict[str, int]:
    return {"num_node_features": NUM_NODE_FEATURES, "num_device_features": NUM_DEVICE_FEATURES}


PRETRAINED = ("data", "policy", "pretrained.pt")


def default_checkpoint() -> Path:
    """The pretrained general checkpoint shipped with the package."""
    from importlib.resources import files

    p = Path(str(files("placement_rl").joinpath(*PRETRAINED)))
    if not p.is_file():
        raise CheckpointError(f"no pretrained checkpoint is installed ({p}): run `placement-rl train trainer=pretrain` "
                              f"and pass checkpoint=<its checkpoint.pt>")
    return p


DRIFT_KEYS = ("state_sha", "cost_model_sha", "fits_sha")  # what a policy's decisions depend on besides its weights


def checkpoint_drift(data: dict[str, Any]) -> list[str]:
    """Which of the checkpoint's recorded hashes (the state the policy reads, the cost model that rewarded it,
    the shipped fits) differ from this code's (``placement_rl.results.code_hashes``); ``["provenance"]`` when the
    checkpoint records none."""
    from placement_rl.results import code_hashes

    prov = (data.get("config") or {}).get("provenance")
    if not isinstance(prov, dict):
        return ["provenance"]
    now = code_hashes()
    return [k for k in DRIFT_KEYS if prov.get(k) != now[k]]


def drift_note(path: str | Path, drift: list[str]) -> str:
    """One line saying how a checkpoint's code differs from this code's, or that the checkpoint records no code
    hashes to compare (``drift == ["provenance"]``); empty when neither."""
    if not drift:
        return ""
    what = {"state_sha": "the state features", "cost_model_sha": "the cost model", "fits_sha": "the GPU fits"}
    head = (f"checkpoint '{path}' records no code hashes, so it may have been trained with other code"
            if drift == ["provenance"] else
            f"checkpoint '{path}' was trained with other code ({', '.join(what[k] for k in drift)} differ)")
    return (f"note: {head}: its placements are valid, its figures may not be this release's "
            "(strict_checkpoint=true refuses it)")


def load_policy(path: str | Path, *, strict: bool = False,
                log: Any = None) -> tuple[DevicePolicy, ConstructiveConfig, dict[str, Any]]:
    """A constructive policy checkpoint: ``(policy, config, raw checkpoint)``; ``CheckpointError`` if it is not
    one or does not match this release's features. Its recorded state / cost-model / fit hashes are compared with
    this code's: a difference is one line through ``log`` (when given), or a ``CheckpointError`` with ``strict``."""
    data = load_checkpoint(path, expect_algo=ALGO)
    drift = checkpoint_drift(data)
    if drift and strict:
        raise CheckpointError(drift_note(path, drift).replace("note: ", "", 1).split(": its placements")[0]
                              + ": retrain it, or drop strict_checkpoint")
    if drift and log is not None:
        log(drift_note(path, drift))
    for k, v in _obs_dims().items():
        if data["obs"].get(k) != v:
            raise CheckpointError(f"checkpoint '{path}' was made with {k}={data['obs'].get(k)!r}; this release "
                                  f"uses {v}: train a new policy")
    known = {f.name for f in dataclasses.fields(ConstructiveConfig)}
    try:
        cfg = ConstructiveConfig(**{k: v for k, v in data["config"].items() if k in known})
        policy = build_policy(cfg)
        policy.load_state_dict(data["policy"])
    except (ConfigError, RuntimeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint '{path}' does not hold a constructive policy this release can load "
                              f"({str(exc).splitlines()[0]})") from None
    policy.eval()
    return policy, cfg, data
