"""Scoring a constructive policy: greedy and best-of-k placements of each task, timed (``evaluate``).

``TaskResult`` holds one task's greedy and sampled rollouts with their own seconds; ``geomean`` is the geometric
mean the reports and early stopping use.

The k "samples" of best-of-k are, first, the policy's greedy placements deciding on links
``baselines.eft.LINK_SCALES`` times slower (up to ``len(LINK_SCALES)`` of them; each run on the true links:
``link_scaled``), then placements sampled from its softmax. Chosen on dev pairs (the shipped checkpoint): on the
communication-heavy ones of ``scripts/probe_learning_comm.py`` (dataflow and series-parallel graphs on links 4x
slower and a DGX A100) the five link-scaled greedy placements with 11 samples give a best of 16 of 0.947 x
``la_rule`` against 0.969 for 16 samples; on the dev split 0.995 against 0.994. The rule with the same slower views
(``la_rule_links``, a registered placer: 0.950 and 0.997 there) is the bar for that row: the slower views help the
rule as much as the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from placement_rl.agents.constructive import Rollout, rollout
from placement_rl.agents.device_policy import DevicePolicy
from placement_rl.envs.constructive_task import ConstructiveTask


def _warm_case():
    from placement_rl.cost import resolve_costs
    from placement_rl.graph import synthetic
    from placement_rl.topology import load_topology

    g, topo = synthetic.sample("layered", num_nodes=48, seed=0), load_topology("8x_a100_nvswitch")
    costs = resolve_costs(g, topo)
    return g, topo, costs, ConstructiveTask(g, topo, costs)


def _warm_threads(policy: DevicePolicy, task: ConstructiveTask, *, greedy: bool = True,
                  episodes: bool = True) -> None:
    """Where ``PLACEMENT_RL_DECODE_THREADS`` asks for threads: the threaded greedy decode and the sampled episodes'
    threaded features (both run only above a work threshold: forced here)."""
    from placement_rl.agents.constructive import graph_tensors
    from placement_rl.agents.fast_decode import greedy_devices
    from placement_rl.cost.split import threads_asked

    if threads_asked() > 1:
        from placement_rl.cost.episodes import episodes_extra

        if greedy:
            with torch.no_grad():
                h = policy.embed(*graph_tensors(task)).double().numpy()
            greedy_devices(policy, task.state(1), h, threads=2)
        if episodes:
            episodes_extra(task.state(2))


def _warm_child() -> None:
    """The lower bound's and the memory fit's kernels (``_warm_side``), then the threaded greedy decode with the
    shipped policy, in a child process ``warm_kernels`` starts on a cold cache where threads are asked: numba
    writes what it compiles to its cache, where the parent then loads it. By the time the child reaches the
    decode, the parent has compiled (and cached) the kernels the two decodes share, so the child compiles only its
    own (measured: the threaded decode alone 8.5 s against 15.6 with its callees)."""
    from placement_rl.agents.constructive_config import default_checkpoint, load_policy

    torch.set_num_threads(1)
    _warm_side()
    policy, _, _ = load_policy(default_checkpoint(), log=lambda *_: None)
    policy.eval()
    _warm_threads(policy, _warm_case()[3], episodes=False)


def _warm_side() -> None:
    """The lower bound's and the memory fit's kernels (their own modules, no kernel shared with the decode), in a
    child process ``warm_kernels`` starts on a cold cache while it compiles the decode: numba writes them to its
    cache, where the parent then loads them."""
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.memory import fit

    g, topo, costs, _ = _warm_case()
    lower_bound(g, costs, topo)
    fit(Problem(g, costs, topo, budget=1, seed=0), np.arange(g.num_nodes, dtype=np.int64) % topo.num_devices)


def _kernels_cold(kernel=None) -> bool:
    """True when numba holds no cache of ``kernel`` (default: the threaded decode's; the first run after an
    install)."""
    try:
        from pathlib import Path

        if kernel is None:
            from placement_rl.cost.split import _decode_split as kernel

        return not Path(kernel._cache._cache_file._index_path).exists()
    except (AttributeError, ImportError, TypeError):  # numba's cache layout is private: then warm here alone
        return False


def warm_kernels(policy: DevicePolicy) -> float:
    """Run the decodes ``evaluate`` runs (greedy, the greedy ones on slower views of the links and sampled ones;
    with threads where ``PLACEMENT_RL_DECODE_THREADS`` asks for them, ``placement_rl.cost.split``), ``simulate``, the
    lower bound and the memory fit (``baselines.memory.fit``) once on a 48-node graph, so that numba compiles or
    loads its kernels before anything is timed. Returns its seconds: on the first run after an install numba
    compiles (on a 2-core machine about 19 s, the decode's kernels here while the bound's and the fit's compile in a
    child process, 30 s all here; with threads asked for, as the CLI does, about 23 s: the child compiles the
    bound's and the fit's kernels, then the threaded greedy decode, this process the serial decode and the sampled
    episodes' threaded kernel; each child writes numba's cache for this process to load), afterwards it loads them
    from its cache (well under 1 s)."""
    import subprocess
    import sys
    import time

    from placement_rl.baselines._fit_kernel import received
    from placement_rl.baselines.bounds import lower_bound
    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.eft import LINK_SCALES
    from placement_rl.baselines.memory import fit
    from placement_rl.cost import simulate
    from placement_rl.cost.split import threads_asked

    t0 = time.perf_counter()

    def start(fn: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", f"from placement_rl.agents.constructive_eval import {fn}; "
                                 f"{fn}()"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # the bound's and the fit's kernels in a child: with threads asked, the child that then compiles the threaded
    # greedy decode, while this process compiles the serial decode and the sampled episodes' threaded kernel (a
    # third process on 2 cores made the warm-up slower: 37 against 27 s; the child doing the side kernels and both
    # threaded ones, 32 s; this split: 23.4 s, against 25.8-28.5 with the side kernels here after the decode)
    threads = threads_asked() > 1
    child = start("_warm_child") if threads and _kernels_cold() else None
    side = start("_warm_side") if child is None and _kernels_cold(received) else None
    g, topo, costs, task = _warm_case()
    was = policy.training
    # the greedy decode, one on each slower view of the links, then 2 sampled episodes (another kernel, as in a
    # best of 16): 48 x 8^2 node-device steps each
    res = evaluate(policy, [task], samples=len(LINK_SCALES) + 2)[0]
    simulate(g, costs, topo, res.greedy.devices[0])
    if child is not None:
        _warm_threads(policy, task, greedy=False)  # the episodes' threaded kernel here, the greedy one there

    def wait(proc) -> None:
        if proc is not None:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:  # never seen; whatever it did not write, this process compiles
                proc.kill()

    wait(side)
    lower_bound(g, costs, topo)  # its blocks part (train's table and place print the bound)
    fit(Problem(g, costs, topo, budget=1, seed=0), res.greedy.devices[0])  # a search's start over memory
    wait(child)
    _warm_threads(policy, task)
    policy.train(was)
    return time.perf_counter() - t0


def geomean(x: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(x, dtype=np.float64))))) if len(x) else float("nan")


def link_scaled(policy: DevicePolicy, task: ConstructiveTask, scales: Sequence[float]) -> Rollout:
    """The policy's greedy placement of ``task`` deciding on links ``scale`` x slower, for each scale, scored on
    the true links (``baselines.eft.link_scaled_devices`` with the policy's head)."""
    from placement_rl.agents.constructive import state_window
    from placement_rl.agents.policy_rollout import student_head
    from placement_rl.baselines.eft import link_scaled_devices
    from placement_rl.cost import Simulator
    from placement_rl.cost.decode import POLICY

    g = task.graph
    head = student_head(policy, task).arrays()
    window = state_window(policy, g.num_nodes)
    sim = Simulator(g, task.costs, task.topology)
    devs = [link_scaled_devices(g, task.costs, task.topology, POLICY, head, window=window, scale=s) for s in scales]
    runs = [sim.run(d) for d in devs]
    return Rollout(np.array(devs, dtype=np.int64).reshape(len(devs), g.num_nodes),
                   np.array([r.step_time for r in runs]), np.array([r.feasible for r in runs], dtype=bool))


@dataclass
class TaskResult:
    """One task's learned results: greedy and best-of-k step times and placements, and the references."""

    task: ConstructiveTask
    greedy: Rollout
    sampled: Rollout | None
    greedy_seconds: float = 0.0  # the greedy placement's own seconds (encoder + decisions + simulate)
    sampled_seconds: float = 0.0  # the samples' own seconds
    link_scales: tuple[float, ...] = ()  # the first len(link_scales) samples: greedy on links that much slower

    @property
    def best_label(self) -> str:
        """What ``best_devices`` is, in words."""
        k = self.best_index
        if k < 0:
            return "greedy"
        if k < len(self.link_scales):
            return f"greedy on links {self.link_scales[k]:g} x slower"
        return f"sample {k - len(self.link_scales) + 1}"

    @property
    def greedy_time(self) -> float:
        return float(self.greedy.times[0])

    def _best(self) -> tuple[float, np.ndarray, int]:
        """The fastest feasible placement of greedy and samples (the greedy one when none is feasible), and which
        (-1: the greedy one, k: sample k)."""
        g = self.greedy_time if bool(self.greedy.feasible[0]) else np.inf
        if self.sampled is not None:
            t = np.where(self.sampled.feasible, self.sampled.times, np.inf)
            k = int(np.argmin(t))
            if t[k] < g:
                return float(t[k]), self.sampled.devices[k], k
        return self.greedy_time, self.greedy.devices[0], -1

    @property
    def best_time(self) -> float:
        """Best of greedy and samples among the placements that fit (an infeasible greedy never counts)."""
        return self._best()[0]

    @property
    def best_devices(self) -> np.ndarray:
        return self._best()[1]

    @property
    def best_index(self) -> int:
        """Which placement ``best_devices`` is: -1 the greedy one, k sample k."""
        return self._best()[2]

    @property
    def best_feasible(self) -> bool:
        """Whether ``best_devices`` fits memory (False only when neither the greedy placement nor a sample does)."""
        return self.best_index >= 0 or bool(self.greedy.feasible[0])


def greedy_result(policy: DevicePolicy, task: ConstructiveTask) -> TaskResult:
    """The task's greedy placement, timed (no samples yet)."""
    import time

    policy.eval()
    t0 = time.perf_counter()
    g = rollout(policy, task, samples=1, greedy=True)
    return TaskResult(task, g, None, time.perf_counter() - t0)


def with_samples(policy: DevicePolicy, res: TaskResult, samples: int, generator: torch.Generator,
                 done: Callable[[int], None] | None = None) -> TaskResult:
    """``res`` with ``samples`` placements added, timed (0: unchanged): the policy's greedy ones on links
    ``LINK_SCALES`` x slower (as many as ``samples`` allows), then the rest drawn from ``generator`` (each part one
    batched decode; ``done(k)``, when given, after each: the placements finished so far)."""
    import time

    from placement_rl.baselines.eft import LINK_SCALES

    if samples <= 0:
        return res
    policy.eval()
    t0 = time.perf_counter()
    scales = tuple(LINK_SCALES[:samples])
    parts = [link_scaled(policy, res.task, scales)]
    if done is not None:
        done(len(scales))
    if samples > len(scales):
        parts.append(rollout(policy, res.task, samples=samples - len(scales), greedy=False, generator=generator))
        if done is not None:
            done(samples)
    s = Rollout(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("devices", "times", "feasible")))
    return TaskResult(res.task, res.greedy, s, res.greedy_seconds, time.perf_counter() - t0, scales)


def evaluate(policy: DevicePolicy, tasks: Sequence[ConstructiveTask], *, samples: int = 16,
             seed: int = 0) -> list[TaskResult]:
    """Greedy and best-of-``samples`` placements of every task (``samples=0``: greedy only)."""
    gen = torch.Generator().manual_seed(seed)
    return [with_samples(policy, greedy_result(policy, t), samples, gen) for t in tasks]


__all__ = ["TaskResult", "evaluate", "geomean", "greedy_result", "link_scaled", "with_samples"]
