"""Op-level executor: real training steps of a captured model with every node on its placed device.

``run_placement`` exports the module as ``capture`` does (the program's call nodes carry the
CompGraph's node names), rewrites the program's fx graph so that

* every call node runs on the device of its graph node (a coarsened graph maps through ``members``;
  ``getitem`` and other helper nodes follow their producer; factory ops get ``device=`` rewritten);
* an op that writes into an input in place (BatchNorm running stats, ``add_``) runs where that input
  lives, so the write is not lost on a copy (``meta["overridden"]`` counts such nodes);
* each parameter, buffer and input lives on the device of its first consumer (a parameter shared by
  several nodes is one leaf; consumers elsewhere get a differentiable copy, so its gradient is the sum
  over all uses, as in the unplaced module);
* a value crossing devices gets one ``.to(device)`` transfer per destination device (the copy op whose
  cost the simulator charges), inserted before its first consumer there;

then runs forward, backward and the optimizer step on copies of the module's parameters (the caller's
module is never changed) and reports the median step time (devices synchronised around each step).

Memory: before anything runs, params + grads + optimizer state + activations (the graph's ``act_bytes``)
+ received tensors per device are checked against ``memory_bytes``; a placement that does not fit,
and a CUDA out-of-memory error during the run, raise ``ExecutionError``. ``peak_memory_per_device`` is
``torch.cuda.max_memory_allocated`` on GPUs (shared by logical devices on one GPU) and, on the CPU,
the placed parameter/gradient/optimizer bytes plus the bytes saved for backward by the device's ops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import fx

from placement_rl.errors import ExecutionError, GraphError, PlanError, ProfileError, fmt_bytes
from placement_rl.executor._stages import check_autograd_functions, interpreted_region
from placement_rl.graph.ir import CompGraph
from placement_rl.plans import Placement
from placement_rl.profiling.program import Program, export_program, is_tensor, mutated_args, retarget, transfer
from placement_rl.profiling.timing import clock_fn
from placement_rl.topology import DeviceTopology

OPTIMIZERS = ("adam", "sgd")
STATE_BYTES_PER_PARAM_BYTE = {"adam": 2.0, "sgd": 0.0}


class MeasurementTimeout(ExecutionError):
    """A measurement ran past its time limit (checked between training steps)."""


@dataclass(frozen=True)
class LocalRunResult:
    median_step_time: float
    step_times: tuple[float, ...]
    peak_memory_per_device: tuple[float, ...]  # bytes, one per topology device
    loss: float  # loss of the first step (initial parameters)
    losses: tuple[float, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)


def _torch_devices(topology: DeviceTopology) -> list[torch.device]:
    out = []
    for d in topology.devices:
        td = torch.device(d.torch_device)
        if td.type == "cuda":
            if not torch.cuda.is_available():
                raise ExecutionError(f"device '{d.name}' is {d.torch_device} but this machine has no CUDA GPU: "
                                     "use a topology of local devices (e.g. topology=2x_cpu or local)")
            td = torch.device("cuda", td.index or 0)
        out.append(td)
    return out


def check_devices(topology: DeviceTopology) -> None:
    """``ExecutionError`` when a device of ``topology`` is a CUDA GPU and this machine has none (before a run
    starts: ``run_placement`` would refuse it)."""
    _torch_devices(topology)


def node_devices(graph: CompGraph, placement: Placement | Sequence[int], topology: DeviceTopology) -> dict[str, int]:
    """Original op name -> device index (through ``members`` for a coarsened graph)."""
    p = placement if isinstance(placement, Placement) else Placement(placement)
    p.validate(graph, topology)
    out: dict[str, int] = {}
    for i, d in enumerate(p.device_of_node.tolist()):
        for m in (graph.members[i] if graph.members is not None else (graph.names[i],)):
            out[m] = int(d)
    return out


class PlacedProgram:
    """The rewritten program with its placed parameters, buffers and inputs (one training step = ``loss()``)."""

    def __init__(self, module: torch.nn.Module, inputs: Sequence[Any], graph: CompGraph,
                 placement: Placement | Sequence[int], topology: DeviceTopology, *,
                 program: Program | None = None) -> None:
        self.program = program or export_program(module, inputs)
        region = interpreted_region(self.program.graph_module,
                                    [m for grp in graph.members for m in grp] if graph.members is not None
                                    else list(graph.names))
        if region:
            raise GraphError(f"graph '{graph.name}': {region}")
        self.program.check_graph(graph)
        self.topology = topology
        self.devices = _torch_devices(topology)
        want = node_devices(graph, placement, topology)
        self.device_of = self._assign(want)
        self._place_values(module, inputs)
        self.graph_module, self.num_transfers = self._rewrite()

    # ------------------------------------------------------------- placement
    def _assign(self, want: Mapping[str, int]) -> dict[str, int]:
        g = self.program.graph_module.graph
        dev: dict[str, int] = {}
        calls = [n for n in g.nodes if n.op == "call_function"]
        for n in calls:  # placed ops, then helpers after their producer (or first placed user)
            if n.name in want:
                dev[n.name] = want[n.name]
        for n in calls:
            if n.name in dev:
                continue
            prods = [a.name for a in n.all_input_nodes if a.name in dev]
            users = [u.name for u in n.users if u.name in want]
            dev[n.name] = dev[prods[0]] if prods else (want[users[0]] if users else 0)
        for n in g.nodes:  # placeholders: device of the first consumer
            if n.op == "placeholder":
                users = [u for u in calls if n in u.all_input_nodes]
                dev[n.name] = dev[users[0].name] if users else 0
        self.overridden = 0
        for n in calls:  # in-place writers run where the written value lives
            for i in mutated_args(n):
                if i < len(n.args) and isinstance(n.args[i], fx.Node) and dev[n.args[i].name] != dev[n.name]:
                    dev[n.name] = dev[n.args[i].name]
                    self.overridden += 1
        return dev

    def _rewrite(self) -> tuple[fx.GraphModule, int]:
        old = self.program.graph_module.graph
        new = fx.Graph()
        env: dict[str, fx.Node] = {}
        moved: dict[tuple[str, int], fx.Node] = {}
        home = self.device_of

        def arg_on(a: fx.Node, d: int) -> fx.Node:
            if home[a.name] == d:
                return env[a.name]
            key = (a.name, d)
            if key not in moved:
                moved[key] = new.call_function(transfer, (env[a.name], self.devices[d]))
                moved[key].name = f"{a.name}__to_{self.topology.devices[d].name}"
            return moved[key]

        for n in old.nodes:
            if n.op == "output":
                env[n.name] = new.output(fx.node.map_arg(n.args[0], lambda a: env[a.name]))
                continue
            if n.op in ("placeholder", "get_attr"):
                env[n.name] = new.node_copy(n, lambda a: env[a.name])
                continue
            d = home[n.name]
            args = fx.node.map_arg(n.args, lambda a: arg_on(a, d))
            kwargs = fx.node.map_arg(n.kwargs, lambda a: arg_on(a, d))
            kwargs = retarget(kwargs, self.devices[d])
            node = new.call_function(n.target, tuple(args), dict(kwargs))
            node.name, node.meta = n.name, dict(n.meta)
            env[n.name] = node
        new.lint()
        return fx.GraphModule(self.program.graph_module, new), len(moved)

    def _place_values(self, module: torch.nn.Module, inputs: Sequence[Any]) -> None:
        values = self.program.flat_values(module, inputs)
        leaf_of: dict[int, tuple[torch.Tensor, int]] = {}
        self.values: list[Any] = []
        self.params: dict[str, torch.Tensor] = {}  # state-dict key -> placed leaf (shared: first key)
        self.param_device: dict[str, int] = {}
        for slot, v in zip(self.program.slots, values):
            d = self.device_of[slot.node]
            if not is_tensor(v):
                self.values.append(v)
                continue
            if slot.kind == "parameter":
                if id(v) in leaf_of:  # tied parameter lifted twice: the same leaf, moved where needed
                    leaf, ld = leaf_of[id(v)]
                    self.device_of[slot.node] = ld
                    self.values.append(leaf)
                    continue
                leaf = torch.nn.Parameter(v.detach().to(self.devices[d]).clone(), requires_grad=v.requires_grad)
                leaf_of[id(v)] = (leaf, d)
                self.params[slot.target] = leaf
                self.param_device[slot.target] = d
                self.values.append(leaf)
            else:
                self.values.append(v.detach().to(self.devices[d]).clone() if slot.kind != "input"
                                   else v.to(self.devices[d]))

    # ------------------------------------------------------------------ step
    def loss(self) -> torch.Tensor:
        """One forward pass of the placed program; returns the scalar loss (on the loss op's device)."""
        out = self.graph_module(*self.values)
        return out[self.program.loss_index] if isinstance(out, (tuple, list)) else out

    def trainable(self) -> list[torch.Tensor]:
        return [p for p in self.params.values() if p.requires_grad]

    def grads(self) -> dict[str, torch.Tensor | None]:
        """Gradient of each parameter (state-dict key) on the CPU, after ``loss().backward()``."""
        return {k: (p.grad.detach().cpu() if p.grad is not None else None) for k, p in self.params.items()}


# ------------------------------------------------------------------ memory
def memory_estimate(graph: CompGraph, placement: Placement | Sequence[int], topology: DeviceTopology, *,
                    optimizer: str = "adam") -> np.ndarray:
    """Bytes per device: params x (1 + grads 1 + optimizer state) + activations kept + received tensors."""
    dev = (placement if isinstance(placement, Placement) else Placement(placement)).device_of_node
    factor = 2.0 + STATE_BYTES_PER_PARAM_BYTE[optimizer]
    mem = np.zeros(topology.num_devices)
    np.add.at(mem, dev, factor * graph.param_bytes + graph.act_bytes)
    if graph.num_edges:
        s, d = graph.edges[:, 0], graph.edges[:, 1]
        cross = dev[s] != dev[d]
        received: dict[tuple[int, int], float] = {}
        for e in np.flatnonzero(cross).tolist():
            key = (int(s[e]), int(dev[d[e]]))
            received[key] = max(received.get(key, 0.0), float(graph.edge_bytes[e]))
        for (_, dd), b in received.items():
            mem[dd] += b
    return mem


def check_memory(graph: CompGraph, placement: Placement | Sequence[int], topology: DeviceTopology, *,
                 optimizer: str = "adam") -> np.ndarray:
    """``memory_estimate``, raising ``ExecutionError`` naming the first device that does not fit."""
    mem = memory_estimate(graph, placement, topology, optimizer=optimizer)
    for j, d in enumerate(topology.devices):
        if mem[j] > d.memory_bytes:
            raise ExecutionError(f"placement does not fit device '{d.name}': it needs ~{fmt_bytes(mem[j])} "
                                 f"(params, grads, {optimizer} state, activations, received tensors) but has "
                                 f"{fmt_bytes(d.memory_bytes)}; move nodes off '{d.name}'")
    return mem


# ------------------------------------------------------------------ run
def _sync(devices: Sequence[torch.device]) -> None:
    for d in {d for d in devices if d.type == "cuda"}:
        torch.cuda.synchronize(d)


def _cpu_memory(placed: PlacedProgram, optimizer: str) -> np.ndarray:
    """Per device: placed params, grads and optimizer state plus storages saved for backward by its ops."""
    n = placed.topology.num_devices
    mem = np.zeros(n)
    factor = 2.0 + STATE_BYTES_PER_PARAM_BYTE[optimizer]
    for key, p in placed.params.items():
        mem[placed.param_device[key]] += factor * p.numel() * p.element_size()
    saved: dict[int, tuple[int, float]] = {}
    current = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in saved and not isinstance(t, torch.nn.Parameter):
            saved[st.data_ptr()] = (current[0], float(st.nbytes()))
        return t

    class _Tracker(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            current[0] = placed.device_of.get(node.name, 0)
            return super().run_node(node)

    param_ptrs = {p.untyped_storage().data_ptr() for p in placed.params.values()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = _Tracker(placed.graph_module).run(*placed.values)
    del out
    for ptr, (d, b) in saved.items():
        if ptr not in param_ptrs:
            mem[d] += b
    return mem


def run_placement(module: torch.nn.Module, inputs: Sequence[Any], graph: CompGraph,
                  placement: Placement | Sequence[int], topology: DeviceTopology, *, steps: int = 5,
                  warmup: int = 1, optimizer: str = "adam", lr: float = 1e-3, time_limit_s: float | None = None,
                  program: Program | None = None, clock: str = "wall",
                  progress: Callable[[int, int], None] | None = None) -> LocalRunResult:
    """Run ``warmup + steps`` real training steps of the placed program; time the last ``steps``.

    ``clock``: ``"wall"`` (devices synchronised around each step) or ``"thread"`` (CPU seconds of this
    thread: CPU-only topologies with one torch thread; immune to other processes sharing the cores).

    ``time_limit_s`` bounds the whole measurement (checked after each step): over it,
    ``MeasurementTimeout`` (an ``ExecutionError``) is raised. ``program``: a cached ``export_program``.
    ``progress(done, total)`` is called after each step, warm-up steps included.
    """
    if optimizer not in OPTIMIZERS:
        raise ExecutionError(f"unknown optimizer '{optimizer}' (choose one of {', '.join(OPTIMIZERS)})")
    if steps < 1 or warmup < 0:
        raise ExecutionError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    try:
        p = placement if isinstance(placement, Placement) else Placement(placement)
        p.validate(graph, topology)
    except PlanError as exc:
        raise ExecutionError(f"invalid placement: {exc}") from None
    check_memory(graph, p, topology, optimizer=optimizer)
    custom = check_autograd_functions(module, inputs)
    if custom:
        raise ExecutionError(custom)
    try:
        now = clock_fn(clock, next((d for d in _torch_devices(topology) if d.type == "cuda"), None))
    except ProfileError as exc:
        raise ExecutionError(str(exc)) from None
    t_start = time.perf_counter()
    try:
        return _run(module, inputs, graph, p, topology, steps=steps, warmup=warmup, optimizer=optimizer, lr=lr,
                    time_limit_s=time_limit_s, program=program, t_start=t_start, now=now, progress=progress)
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        raise ExecutionError(f"CUDA out of memory running the placement ({str(exc).splitlines()[0]}); "
                             "move nodes to devices with free memory") from None


def _run(module, inputs, graph, placement, topology, *, steps, warmup, optimizer, lr, time_limit_s, program,
         t_start, now, progress=None) -> LocalRunResult:
    placed = PlacedProgram(module, inputs, graph, placement, topology, program=program)
    devices = placed.devices
    params = placed.trainable()
    opt = (torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr))
    cuda_devs = sorted({d for d in devices if d.type == "cuda"}, key=str)
    for d in cuda_devs:
        torch.cuda.reset_peak_memory_stats(d)

    def check_time() -> None:
        if progress is not None:
            progress(len(losses), warmup + steps)
        if time_limit_s is not None and time.perf_counter() - t_start > time_limit_s:
            raise MeasurementTimeout(f"measurement of placement exceeded its time limit of {time_limit_s:g} s "
                                     f"({time.perf_counter() - t_start:.1f} s elapsed); raise the limit or use a "
                                     "smaller model")

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = placed.loss()
        loss.backward()
        opt.step()
        return float(loss.detach())

    losses, times = [], []
    with torch.enable_grad():
        cpu_mem = _cpu_memory(placed, optimizer)  # one instrumented forward (no step taken)
        for _ in range(warmup):
            losses.append(step())
            check_time()
        for _ in range(steps):
            _sync(devices)
            t0 = now()
            losses.append(step())
            _sync(devices)
            times.append(now() - t0)
            check_time()
    peak = cpu_mem.copy()
    for j, d in enumerate(devices):
        if d.type == "cuda":
            peak[j] = float(torch.cuda.max_memory_allocated(d))
    return LocalRunResult(median_step_time=float(np.median(times)), step_times=tuple(times),
                          peak_memory_per_device=tuple(float(x) for x in peak), loss=losses[0],
                          losses=tuple(losses),
                          meta={"transfers": placed.num_transfers, "overridden": placed.overridden,
                                "memory_source": ["cuda" if d.type == "cuda" else "estimate" for d in devices]})
