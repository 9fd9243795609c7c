"""``placement-rl place``'s notes and checks: the lines it prints about samples, bounds, memory, coarsening and a
checkpoint's recorded graph options, and the one it ends with when interrupted in its samples (kept apart from the
command's run)."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import numpy as np

from placement_rl.cli.common import plural

INTERRUPTED_EXIT = 130  # the exit code of an interrupted command (``hydra_app``'s for Ctrl-C)


@contextlib.contextmanager
def said_on_signal(line: str, *, restore: bool = False) -> Iterator[None]:
    """While the block runs, SIGINT or SIGTERM prints ``line`` on stderr and ends the process at once (exit code
    ``INTERRUPTED_EXIT``); the files written before the block stay as they are, and an earlier run's files set
    aside from the folder are put back (``restore``: the run wrote none of its own yet) or named in the line. A
    Python handler alone would wait for the compiled decode in progress to return, minutes for the greedy pass or
    one batched decode of the samples on 5,000 nodes (Slurm and Kubernetes follow SIGTERM with SIGKILL within
    about 30 s): here the signal wakes a thread (``signal.set_wakeup_fd``), which runs while the decode holds no
    GIL. Outside the main thread, or in a launcher's job worker (its driver reports the interrupt), the block runs
    as it is."""
    import os
    import signal
    import threading

    from placement_rl.cli.common import in_job_worker

    if threading.current_thread() is not threading.main_thread() or in_job_worker():
        yield
        return
    # a signal the process was started ignoring (a background job of a script: SIGINT) stays ignored
    stops = tuple(s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN)
    read, write = os.pipe()
    os.set_blocking(write, False)
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    before = {sig: signal.signal(sig, _noted) for sig in stops}
    thread = threading.Thread(target=_watch, args=(read, stops, line, restore), name="placement-rl-interrupt",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: one set outside Python
        signal.set_wakeup_fd(wakeup)
        os.close(write)  # the watcher reads the end of the pipe and returns
        thread.join()
        os.close(read)


def _noted(signum: int, frame) -> None:
    """The Python handler of ``said_on_signal``'s signals: nothing (its watcher thread ends the process)."""


def _watch(read: int, stops: tuple[int, ...], line: str, restore: bool) -> None:
    """Wait on the wakeup pipe; at a signal of ``stops`` (another with a Python handler writes there too), flush
    stdout, put back an earlier run's files set aside from the folder (``restore``) or name where they are in
    ``line`` (ending at once, nothing else puts them back), print it on stderr and end the process."""
    import os
    import sys

    from placement_rl.cli.run_folder import held_note, restore_held

    while got := os.read(read, 1):
        if got[0] in stops:
            sys.stdout.flush()
            if restore:
                with contextlib.suppress(OSError):  # what does not go back is named
                    restore_held()
            print(line + held_note(), file=sys.stderr, flush=True)
            os._exit(INTERRUPTED_EXIT)


def samples_status(done: int, samples: int) -> str:
    """``0 of 16 done (the 5 on slower links decoded together)``: each part of ``with_samples`` is one batched
    decode, counted when it ends."""
    from placement_rl.baselines.eft import LINK_SCALES

    scaled = min(samples, len(LINK_SCALES))
    part = (f"the {scaled} on slower links" if done < scaled else f"the {samples - scaled} drawn ones")
    return f"{done} of {samples} done" + (f" ({part} decoded together)" if done < samples else "")


SAMPLES_NOTE_SECONDS = 30.0  # samples expected to take longer than this get a line before they start


def samples_note(samples: int, greedy_seconds: float) -> str | None:
    """One line before ``samples`` placements expected to take more than ``SAMPLES_NOTE_SECONDS``: about
    ``samples`` x the greedy pass's seconds, and how to skip them (beyond ``LONG_SAMPLES_SECONDS``, also the
    ``samples=K`` that take about that long); None where they are expected sooner.

    Why that multiple (``agents.constructive_eval.with_samples``): each sample places every node again, making the
    greedy pass's decisions with its window features. The ones on slower links run the greedy kernel itself, one
    after another on one thread; the drawn ones run as one batch that still builds every episode's features at
    every decision. Measured on a busy 2-core machine: 500 nodes on 8 devices, a sample on slower links 1.04 x the
    greedy pass on one thread, a drawn one 1.28 x; 502 nodes on 64 devices, 1.50 and 1.37 x the greedy pass on two
    threads. Where the command asks for threads the greedy pass splits each decision's devices over them
    (``cost.split``), and the multiple then also carries their speed-up, or their loss on busy cores (the 8-device
    pass took 18 x longer on two threads there): an order of magnitude, not a forecast."""
    from placement_rl.baselines.eft import LINK_SCALES

    expected = samples * greedy_seconds
    if expected <= SAMPLES_NOTE_SECONDS:
        return None
    scaled = min(samples, len(LINK_SCALES))
    parts = f"{scaled} on slower links" + (f", {samples - scaled} drawn" if samples > scaled else "")
    return (f"{plural(samples, 'sample')} next, about {samples} x the greedy pass's {greedy_seconds:.1f} s "
            f"({_took(expected)}): each places every node again ({parts}); {_fewer(greedy_seconds, expected)}")


def _took(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


LONG_SAMPLES_SECONDS = 600.0  # samples expected to take longer: ``samples_note`` says how many take about this long


def _fewer(greedy_seconds: float, expected: float) -> str:
    """How to take fewer samples: beyond ``LONG_SAMPLES_SECONDS``, the ``samples=K`` that take about that long."""
    if expected <= LONG_SAMPLES_SECONDS:
        return "samples=0 skips them, fewer take less"
    k = int(LONG_SAMPLES_SECONDS // greedy_seconds)
    return (f"samples={k} caps them at about {_took(k * greedy_seconds)}, " if k > 0 else "") + "samples=0 skips them"


def coarse_groups(graph) -> int | None:
    """The number of groups when ``graph`` is a coarsened one (its nodes group more ops than it has nodes), else
    None: a bound on placing it bounds placements of those groups, not of the ops."""
    source = (graph.meta.get("coarsen") or {}).get("source_nodes", 0)
    return graph.num_nodes if graph.members is not None and int(source) > graph.num_nodes else None


def bound_note(bound, step_time: float, fits: bool = True, groups: int | None = None) -> str:
    """One line: no placement is faster than the bound (which part gives it), and how far the plan is above it
    (``fits`` false: the plan overflows memory, which the bound sets aside; ``groups``: the graph placed is
    coarsened into that many groups, and the bound holds for placements of those)."""
    part = max(bound.parts, key=bound.parts.get)
    gap = bound.gap(step_time)
    which = "no placement" if groups is None else f"no placement of these {plural(groups, 'group')}"
    return (f"lower bound {bound.value * 1e3:.3f} ms ({which} is faster; from its {part} part): the plan is "
            + ("at the bound" if gap < 5e-4 else f"{gap:.1%} above it, at most {1 - 1 / (1 + gap):.1%} to gain")
            + (" (the bound sets memory aside: where memory is tight no placement may come near it)" if fits and
               gap >= 5e-4 else "" if fits else " (memory aside: the bound does not count it, and the plan does "
                                                 "not fit)"))


def fit_row(graph, costs, topology, devices, seed: int) -> dict | None:
    """The plan with nodes moved off the devices over memory (``baselines.memory.fit``: no simulator call but the
    one that scores it), or None when that does not make it fit."""
    from placement_rl.baselines.common import Problem
    from placement_rl.baselines.memory import fit

    t0 = time.perf_counter()
    prob = Problem(graph, costs, topology, budget=1, seed=seed)
    dev, over = fit(prob, np.asarray(devices, dtype=np.int64))
    if over > 0.0:
        return None
    sc = prob.score(dev)
    return {"step_time": float(sc.step_time), "feasible": bool(sc.feasible), "moved": int((dev != devices).sum()),
            "seconds": time.perf_counter() - t0, "devices": dev}


def overflow_note(graph, costs, topology, devices, samples: int, *, searched: dict | None,
                  fitted: dict | None = None, policy_searched: dict | None = None) -> str:
    """One line for a written placement that does not fit memory: by how much, on which devices, what to do."""
    from placement_rl.cost import simulate
    from placement_rl.errors import fmt_bytes

    peak, cap = simulate(graph, costs, topology, devices).peak_memory, topology.array("memory_bytes")
    over = [f"{topology.device_names[d]} {fmt_bytes(peak[d])} of {fmt_bytes(cap[d])}"
            for d in np.flatnonzero(peak > cap)]
    which = "the greedy placement" + (f" and its {plural(samples, 'sample')}" if samples > 0 else "")
    alone = too_big_node(graph, costs, topology)
    if alone is not None:  # nothing op-level can fit: no search or move helps
        name, need, most = alone
        return (f"warning: {which} {_verb(samples)} memory ({', '.join(over)}), and no op-level placement fits: "
                f"node '{name}' alone pins {fmt_bytes(need)} and the largest device holds {fmt_bytes(most)}; shard it "
                "(the FSDP and tensor-parallel stage plans of `placement-rl evaluate suite=single` with this graph and "
                "topology) or give the devices more memory")
    fix = ("the search from it fits (search/placement.json)" if searched and searched["feasible"] else
           "policy_search's placement fits (policy_search/placement.json)" if policy_searched
           and policy_searched["feasible"] else
           "search_seconds=<s> or search_budget=<calls> runs a search that repairs memory first, or give the devices "
           "more memory")
    if fitted is not None:
        fix = (f"with {plural(fitted['moved'], 'node')} moved it fits at {fitted['step_time'] * 1e3:.3f} ms "
               f"(fit/placement.json); " + fix)
    return f"warning: {which} {_verb(samples)} memory ({', '.join(over)}); placement.json holds the greedy one: {fix}"


def _verb(samples: int) -> str:
    return "overflow" if samples > 0 else "overflows"


def too_big_node(graph, costs, topology) -> tuple[str, float, float] | None:
    """``(name, bytes, largest capacity)`` of the node that pins the most memory when that alone is more than
    any device holds (then no op-level placement fits), else None."""
    from placement_rl.cost.memory import pinned_memory

    mem = pinned_memory(graph, costs)  # what each placer counts a node to pin (``Problem.node_mem``)
    most = float(topology.array("memory_bytes").max())
    v = int(np.argmax(mem)) if len(mem) else 0
    return (graph.names[v], float(mem[v]), most) if len(mem) and mem[v] > most else None


# decode=one_pass embeds the graph once (agents.rollout.zero_shot_place); training scored step-by-step rollouts
ONE_PASS_NOTE = ("note: decode=one_pass embeds the graph once and places every node from that, an approximation of "
                 "this PlacementEnv policy; decode=sequential replays its step-by-step rollout: on the graph and "
                 "topology it trained on, the greedy placement training scored (policy_greedy_time in train's "
                 "metrics.json), as place runs the env with the options the checkpoint records and starts where "
                 "training's next episode would have")
# the env options a checkpoint records that place sets itself: the observation's padding
LAYOUT_OPTIONS = ("max_nodes", "max_edges", "max_devices", "op_type_buckets")
# and those tied to the graph trained on (``envs.pipeline.PipelineConfig``): its batch, the micro-batches that
# divide it, a TP degree its split sizes allow; on another graph the env takes that graph's (and chooses the rest)
GRAPH_OPTIONS = ("batch_size", "num_microbatches", "tp")


def same_graph(config: dict, graph, graph_cfg: dict | None) -> bool:
    """Whether ``graph`` is the one training ran on: its fingerprint against the one the checkpoint records (a
    graph file edited since, or a zoo model captured at another batch, differs), else (an earlier checkpoint)
    its graph config against training's."""
    recorded = config.get("graph_fingerprint")
    if recorded is not None:
        return recorded == graph.fingerprint()
    return graph_cfg is not None and graph_cfg == config.get("graph")


def env_setup(ckpt: dict, graph, topology, graph_cfg: dict | None = None) -> tuple[dict, str | None]:
    """``(env options, start)``: the options the checkpoint records (less the padding, which place sets, and less
    ``GRAPH_OPTIONS`` unless ``graph`` is the one training ran on: ``same_graph``), with
    ``start_devices`` where it records the start of a warm-started ``PlacementEnv`` (``envs.warm_start``) on this
    graph and topology; ``start`` says where a ``PlacementEnv``'s episodes start (None for the other envs)."""
    from placement_rl.envs.warm_start import STARTS

    config = ckpt["config"]
    opts = {k: v for k, v in (config.get("env_options") or {}).items() if k not in LAYOUT_OPTIONS}
    if not same_graph(config, graph, graph_cfg):
        opts = {k: v for k, v in opts.items() if k not in GRAPH_OPTIONS}
    if not config["env_id"].startswith("placement_rl/PlacementEnv"):
        return opts, None
    if "env_options" not in config:
        return opts, "initial_placement=best_single (the env's default: the checkpoint records no env options)"
    ip = str(opts.get("initial_placement", "best_single"))
    rec = config.get("start")
    if ip in STARTS and rec and rec["graph"] == graph.fingerprint() and rec["topology"] == topology.name \
            and rec.get("num_devices") == topology.num_devices and len(rec["devices"]) == graph.num_nodes:
        opts["start_devices"] = list(rec["devices"])
        return opts, f"initial_placement={ip}: the placement training recorded on this graph and topology"
    return opts, f"initial_placement={ip}" + (": the best cheap heuristic's placement" if ip in STARTS else "")


def graph_options_note(path: str, left: dict, graph) -> str:
    """One line: the options of training's graph that place leaves out on this one, and the batch it runs at."""
    from placement_rl.plans import graph_batch_size

    batch = graph_batch_size(graph)
    chosen = [name for key, name in (("num_microbatches", "the micro-batch count"), ("tp", "the TP degree"))
              if key in left]
    return (f"note: {path} was trained with {', '.join(f'{k}={v}' for k, v in left.items())}, options of the "
            f"graph it trained on: {graph.name} is planned "
            + (f"at its own batch ({batch})" if batch else "with no batch size (it records none)")
            + ", as the baselines are" + (f", and the policy chooses {' and '.join(chosen)}" if chosen else ""))


def unrecorded_note(path: str) -> str:
    return (f"note: {path} records no env options (an earlier release wrote it): the env runs with its defaults "
            "(PlacementEnv: every node starts on the best single device), which may not be training's, so a "
            "sequential rollout may not be the one training scored")
