"""A/B timing of one deployed part: our executor's step (``_runner.PartRunner``) against a hand-written reference,
in the same processes, steps interleaved (ours, hand, hand, ours, ...): same load, same moment.

``run_ab(part_dir, steps=..., warmup=..., world=..., make_hand=...)`` starts ``world`` gloo ranks on CPU
(``spawn``), each building ``PartRunner`` and ``make_hand(part_dir, rank, num_stages)`` (a module-level function,
so that it pickles; its result has ``step() -> seconds``), and returns per step the slowest rank's time of each:
``(ours [steps], hand [steps])``. ``scripts/bench_executor.py`` (DDP / FSDP2 / pipelining references) and
``scripts/bench_tp.py`` (tensor-parallel references) use it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
import torch.distributed as dist

from placement_rl.executor._launch import free_port
from placement_rl.executor._runner import PartRunner


class Stepper(Protocol):
    def step(self) -> float: ...


MakeHand = Callable[[Path, int, int], Stepper]


def ab_worker(rank: int, world: int, port: int, part_dir: str, steps: int, warmup: int, queue: Any,
              make_hand: MakeHand) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ours = PartRunner({"lr": 1e-3}, Path(part_dir), rank=rank, device=torch.device("cpu"))
    stages = json.loads((Path(part_dir) / "part.json").read_text())["dims"]["num_stages"]
    hand = make_hand(Path(part_dir), rank, int(stages))
    t_ours, t_hand = [], []
    for step in range(warmup + steps):
        order = (ours, hand) if step % 2 == 0 else (hand, ours)
        got = {id(r): (r.step().wall if r is ours else r.step()) for r in order}
        if step >= warmup:
            t_ours.append(got[id(ours)])
            t_hand.append(got[id(hand)])
    queue.put((rank, t_ours, t_hand))
    dist.destroy_process_group()


def run_ab(part_dir: Path, *, steps: int, warmup: int, world: int, make_hand: MakeHand,
           join_timeout: float = 900.0) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the slowest rank's time: (ours, hand-written)."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    os.environ["OMP_NUM_THREADS"] = "1"
    procs = [ctx.Process(target=ab_worker, args=(r, world, port, str(part_dir), steps, warmup, queue, make_hand))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(join_timeout)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"A/B run failed: exit codes {[p.exitcode for p in procs]}")
    got = {r: (a, b) for r, a, b in (queue.get() for _ in range(world))}
    return (np.max(np.array([got[r][0] for r in range(world)]), axis=0),
            np.max(np.array([got[r][1] for r in range(world)]), axis=0))
