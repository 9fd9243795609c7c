"""Per-node forward/backward timing of a captured model on a real device, plus whole-step timing.

``profile_graph`` exports the module (as capture does), runs the program once with real tensors on the
device to get every node's concrete inputs, then times each node on its own:

* forward: timed in place, while the program runs op after op with autograd on (``forward_in_situ``):
  each op sees the cache and allocator state of a real forward pass (activations stay alive, outputs go
  to fresh memory). Timing each op in a tight loop on the same inputs instead under-reads by 20-50% on
  a CPU (warm caches, a reused output block);
* backward: ``torch.autograd.grad`` of the op's outputs (ones-like output gradients) with respect to the
  inputs that needed a gradient in the real step (parameters and activations downstream of them), in a
  loop, minus the fixed cost of one ``autograd.grad`` call (``grad_call_overhead``: the engine start a
  whole backward pays once, ~16 us per call on the development CPU); a node with no such input has no
  backward (0).

CPU samples come from ``time.perf_counter``, GPU samples from CUDA events (``placement_rl.profiling.timing``).
A coarsened graph is profiled op by op; a group's time is the sum of its members'. The run is resumable:
the DB is saved every ``save_every`` nodes and nodes already profiled on the device are skipped.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree

from placement_rl.errors import ProfileError
from placement_rl.graph.ir import CompGraph
from placement_rl.profiling.db import ProfileDB
from placement_rl.profiling.program import (Record, export_program, is_tensor, mutated_args, needs_grad, record,
                                           retarget)
from placement_rl.profiling.timing import clock_fn, time_fn, wall_samples
from placement_rl.topology import Device


def as_device(device: Device | str) -> Device:
    """A topology ``Device`` (its name keys the DB); a plain string names a local torch device."""
    if isinstance(device, Device):
        return device
    td = torch.device(device)
    kind = "gpu" if td.type == "cuda" else "cpu"
    if td.type not in ("cpu", "cuda"):
        raise ProfileError(f"cannot profile on torch device '{device}': use 'cpu' or 'cuda:<i>'")
    name = "cpu" if kind == "cpu" else f"gpu{td.index or 0}"
    return Device(name=name, kind=kind, torch_device=str(td), peak_flops=1.0, mem_bandwidth=1.0, memory_bytes=1.0)


def _torch_device(device: Device) -> torch.device:
    td = torch.device(device.torch_device)
    if td.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"device '{device.name}' is {device.torch_device} but this machine has no CUDA GPU")
    if td.type == "cuda" and td.index is None:
        td = torch.device("cuda", 0)
    return td


def placed_values(program_values: Sequence[Any], slots: Sequence[Any], device: torch.device) -> list[Any]:
    """Copies of the placeholder values on ``device``: parameters as fresh leaves, buffers cloned."""
    out = []
    for v, s in zip(program_values, slots):
        if not is_tensor(v):
            out.append(v)
        elif s.kind == "parameter":
            out.append(v.detach().to(device).clone().requires_grad_(v.requires_grad))
        else:
            out.append(v.detach().to(device).clone())
    return out


def _leaf(x: Any) -> Any:
    if not is_tensor(x):
        return x
    t = x.detach()
    return t.requires_grad_(True) if x.requires_grad else t


class _NodeBench:
    """Forward and backward callables of one recorded node, on detached copies of its inputs."""

    def __init__(self, rec: Record, mutated: list[int]) -> None:
        self.rec = rec
        args = [pytree.tree_map(_leaf, a) for a in rec.args]
        self.kwargs = pytree.tree_map(_leaf, rec.kwargs)
        self.grad_inputs = [x for x in pytree.tree_leaves((args, self.kwargs)) if needs_grad(x)]
        # an op writing in place into a leaf that needs a gradient gets a (non-leaf) copy, once
        for i in mutated:
            if i < len(args) and needs_grad(args[i]):
                args[i] = args[i].clone()
        self.args = args

    def forward(self) -> Any:
        return self.rec.target(*self.args, **self.kwargs)

    def backward_fn(self):
        if not self.grad_inputs:
            return None
        with torch.enable_grad():
            out = self.forward()
        outs = [o for o in pytree.tree_leaves(out) if needs_grad(o) and o.grad_fn is not None]
        if not outs:
            return None
        grads = [torch.ones_like(o) for o in outs]
        ins = self.grad_inputs
        return lambda: torch.autograd.grad(outs, ins, grads, retain_graph=True, allow_unused=True)


def forward_in_situ(program: Any, values: Sequence[Any], device: torch.device, *, warmup: int, repeats: int,
                    clock: str = "wall") -> dict[str, list[float]]:
    """Per call node, ``repeats`` samples of its op's time inside whole sequential forward passes.

    CPU: ``clock`` read around each op call; GPU: a CUDA event pair around each op (read after the pass).
    """
    from torch import fx

    gm = program.graph_module
    cuda = device.type == "cuda"
    now = clock_fn(clock, device)
    samples: dict[str, list[float]] = {}
    for it in range(warmup + repeats):
        env: dict[str, Any] = {}
        ph = iter(values)
        events: list[tuple[str, Any, Any]] = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node.name] = next(ph)
            elif node.op == "get_attr":
                env[node.name] = getattr(gm, node.target)
            elif node.op == "call_function":
                args = fx.node.map_arg(node.args, lambda n: env[n.name])
                kwargs = retarget(fx.node.map_arg(node.kwargs, lambda n: env[n.name]), device)
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    env[node.name] = node.target(*args, **kwargs)
                    end.record()
                    events.append((node.name, start, end))
                else:
                    t0 = now()
                    env[node.name] = node.target(*args, **kwargs)
                    t1 = now()
                    if it >= warmup:
                        samples.setdefault(node.name, []).append(t1 - t0)
        if cuda:
            torch.cuda.synchronize(device)
            if it >= warmup:
                for name, start, end in events:
                    samples.setdefault(name, []).append(start.elapsed_time(end) / 1e3)
        del env
    return samples


def grad_call_overhead(device: torch.device, *, clock: str = "wall", repeats: int = 15) -> float:
    """Fixed seconds of one ``torch.autograd.grad`` call (engine start-up), per-node work excluded.

    The intercept of the time through chains of 1 and 17 trivial view nodes: a whole backward pays this
    once, a node timed on its own pays it on every call. (Development CPU: ~14 us fixed, ~3 us a node.)
    """
    def chain(k: int) -> float:
        x = torch.ones(1, device=device, requires_grad=True)
        y = x
        for _ in range(k):
            y = y.view_as(y)
        g = torch.ones_like(y)
        samples = time_fn(lambda: torch.autograd.grad([y], [x], [g], retain_graph=True), device, warmup=3,
                          repeats=repeats, clock=clock)
        return float(sorted(samples)[len(samples) // 2])

    one, many = chain(1), chain(17)
    return max(0.0, one - (many - one) / 16)


def op_names_of(graph: CompGraph) -> list[str]:
    """The original op names a graph stands for (its members when coarsened)."""
    if graph.members is None:
        return list(graph.names)
    return [m for grp in graph.members for m in grp]


def profile_graph(module: torch.nn.Module, inputs: Sequence[Any], graph: CompGraph, device: Device | str, *,
                  warmup: int = 3, repeats: int = 10, progress: bool = True, db: ProfileDB | None = None,
                  save_every: int = 25, step_repeats: int | None = None, clock: str = "wall") -> ProfileDB:
    """Time every op of ``graph`` (captured from ``module`` on ``inputs``) on ``device`` into a ProfileDB.

    ``db``: an existing DB to extend or resume (nodes it already has on this device are skipped); saved
    every ``save_every`` nodes when it has a path. Also records the whole-step (forward + backward) time
    of ``module`` (``step_repeats`` samples, default ``repeats``) and of one optimizer step.
    ``clock``: ``"wall"`` or ``"thread"`` (CPU time, see ``placement_rl.profiling.timing``); recorded
    with the device, and a DB never mixes clocks for one device.
    """
    from tqdm.auto import tqdm

    if warmup < 0 or repeats < 1:
        raise ProfileError(f"warmup must be >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    dev_spec = as_device(device)
    dev = _torch_device(dev_spec)
    db = db if db is not None else ProfileDB()
    clock_fn(clock, dev)
    if dev_spec.name not in db.data["devices"]:
        db.add_device(dev_spec.name, dev_spec)
        db.data["devices"][dev_spec.name]["clock"] = clock
    elif db.data["devices"][dev_spec.name].get("clock", "wall") != clock:
        raise ProfileError(f"profile {db.label} timed device '{dev_spec.name}' with the "
                           f"{db.data['devices'][dev_spec.name].get('clock', 'wall')} clock, not {clock!r}: "
                           "use the same clock or another output file")
    program = export_program(module, inputs)
    program.check_graph(graph)
    done = db.node_times(graph, dev_spec.name)
    todo = [m for m in op_names_of(graph) if m not in done]
    nodes = {n.name: n for n in program.call_nodes}
    if todo:
        values = placed_values(program.flat_values(module, inputs), program.slots, dev)
        with torch.enable_grad():
            recs = record(program, values, device=dev)
        with torch.enable_grad():
            fwd_all = forward_in_situ(program, values, dev, warmup=warmup, repeats=repeats, clock=clock)
            overhead = grad_call_overhead(dev, clock=clock)
        db.data["devices"][dev_spec.name]["bwd_call_overhead"] = overhead
        bar = tqdm(todo, desc=f"profile {graph.name} on {dev_spec.name}", disable=not progress, leave=False)
        for k, name in enumerate(bar, start=1):
            bench = _NodeBench(recs[name], mutated_args(nodes[name]))
            with torch.enable_grad():
                bwd_fn = bench.backward_fn()
                bwd = time_fn(bwd_fn, dev, warmup=warmup, repeats=repeats, clock=clock) if bwd_fn is not None else []
            bwd = [max(b - overhead, 0.0) for b in bwd]
            db.put_node(graph, dev_spec.name, name, fwd_all[name], bwd, signature=recs[name].signature)
            if db.path is not None and save_every > 0 and k % save_every == 0:
                db.save()
        del recs, values
    if db.optimizer_time(graph, dev_spec.name) is None:
        samples, nbytes = measure_optimizer(module, dev_spec, warmup=warmup, repeats=step_repeats or repeats,
                                            clock=clock)
        db.put_optimizer(graph, dev_spec.name, samples, nbytes)
    if db.step_time(graph, dev_spec.name) is None:
        db.put_step(graph, dev_spec.name, measure_step(module, inputs, dev_spec, warmup=warmup,
                                                       repeats=step_repeats or repeats, clock=clock))
    if db.path is not None:
        db.save()
    return db


def measure_step(module: torch.nn.Module, inputs: Sequence[Any], device: Device | str, *, warmup: int = 3,
                 repeats: int = 10, clock: str = "wall") -> list[float]:
    """Seconds of each whole training-step forward + backward (``loss = module(*inputs); loss.backward()``).

    Runs on a copy of the module moved to the device, gradients cleared (outside the timed region is not
    possible for ``set_to_none``; it costs nanoseconds) before each step.
    """
    dev = _torch_device(as_device(device))
    model = copy.deepcopy(module).to(dev)
    args = pytree.tree_map(lambda x: x.to(dev) if is_tensor(x) else x, tuple(inputs))
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        for p in params:
            p.grad = None
        loss = model(*args)
        loss.backward()

    with torch.enable_grad():
        return wall_samples(step, dev, warmup=warmup, repeats=repeats, clock=clock)


def measure_optimizer(module: torch.nn.Module, device: Device | str, *, optimizer: str = "adam", lr: float = 1e-3,
                      warmup: int = 3, repeats: int = 10, clock: str = "wall") -> tuple[list[float], float]:
    """Seconds of each optimizer step over copies of the module's trainable parameters (unit gradients),
    and the parameters' bytes. ``optimizer``: ``adam`` or ``sgd`` (as the executor builds them)."""
    dev = _torch_device(as_device(device))
    params = [torch.nn.Parameter(p.detach().to(dev).clone()) for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    if optimizer not in ("adam", "sgd"):
        raise ProfileError(f"unknown optimizer '{optimizer}' (choose adam or sgd)")
    opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr)
    nbytes = float(sum(p.numel() * p.element_size() for p in params))
    if not params:
        return [0.0] * repeats, 0.0
    return wall_samples(opt.step, dev, warmup=warmup, repeats=repeats, clock=clock), nbytes


def op_signatures(module: torch.nn.Module, inputs: Sequence[Any], graph: CompGraph) -> list[str]:
    """``op[shapes]`` (with ``:bf16`` etc. where its tensors are not fp32: ``program.Record.signature``) of every
    node of an uncoarsened ``graph`` captured from ``module`` on ``inputs``.

    Put them in ``graph.meta["signatures"]`` (``graph.replace(meta=...)``) to let ``ProfileDB.lookup``
    reuse per-op times measured on other graphs with the same ops and shapes.
    """
    if graph.members is not None:
        raise ProfileError(f"graph '{graph.name}' is coarsened: take signatures of the graph it came from")
    program = export_program(module, inputs)
    program.check_graph(graph)
    values = placed_values(program.flat_values(module, inputs), program.slots, torch.device("cpu"))
    with torch.no_grad():
        recs = record(program, values)
    return [recs[n].signature for n in graph.names]
