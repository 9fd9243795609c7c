"""``placement-rl profile``: measure per-node fwd/bwd times and link speeds on local devices -> ProfileDB."""

from __future__ import annotations

from omegaconf import DictConfig

from placement_rl.cli.common import hydra_app, output_dir, to_container
from placement_rl.errors import ConfigError

NO_PER_BYTE = 1e15  # bytes/s: a fitted bandwidth above this is a flat time curve (a petabyte per second), not a link


def run(cfg: DictConfig):
    from placement_rl.profiling.run import run_profile

    if cfg.get("measurements"):  # import a public GPU measurement file (its reader's error exits 2)
        from placement_rl.profiling.measured_io import read_measurements

        lines, db = read_measurements(str(cfg.measurements))
        print("\n".join(lines))
        if db is not None:
            print(f"wrote {db.save(cfg.output or output_dir() / 'profile.json')}")
        return db
    from placement_rl.profiling.run import select_devices

    g = cfg.graph
    if g.get("path") or g.get("source", "zoo") != "zoo":
        raise ConfigError("profile needs a zoo model (graph=<name>): profiling runs the model's real ops")
    devices = list(cfg.devices) if cfg.devices else None
    select_devices(devices)  # an unknown device name: one line before the graph is captured or anything written
    out = output_dir()
    target = cfg.output or out / "profile.json"
    res = run_profile(str(g.name), output=target, overrides=to_container(g.get("overrides")) or {},
                      devices=devices, warmup=int(cfg.warmup),
                      repeats=int(cfg.repeats), links=bool(cfg.links), processes=bool(cfg.processes),
                      threads=cfg.threads, progress=bool(cfg.progress), graph_out=out / "graph.json")
    from placement_rl.topology import detect_local

    local = {d.name: d for d in detect_local(measure=False).devices}
    graph = res.graph
    for dev in res.devices:
        kept = res.kept.get(dev, 0)
        if kept:
            rec = res.db.data["devices"][dev]
            print(f"{dev}: {kept} of {graph.num_nodes} nodes kept from the earlier run in {res.path} "
                  f"({rec.get('threads')} thread{'s' if rec.get('threads') != 1 else ''}, repeats {cfg.repeats}); "
                  f"{graph.num_nodes - kept} measured")
    for dev in res.devices:
        hit = res.db.lookup(graph, local[dev])
        if hit is not None:
            fwd, bwd, label = hit
            print(f"{dev}: {graph.num_nodes} nodes, forward {fwd.sum() * 1e3:.3f} ms, "
                  f"backward {bwd.sum() * 1e3:.3f} ms (sum of per-node medians; {label})")
    for link in res.db.links():
        print(link_line(link))
    print(f"wrote {res.path} and {out / 'graph.json'}")
    return res


def link_line(link: dict) -> str:
    """One measured link fit, as ``profile`` prints it."""
    if link["src"] == link["dst"] and link["backend"] == "copy":  # .to() onto its own device: nothing moves
        per_byte = "no time per byte (the same torch device: nothing is copied)"
    elif link["bandwidth"] < NO_PER_BYTE:
        per_byte = f"bandwidth {link['bandwidth'] / 1e9:.2f} GB/s"
    else:
        per_byte = "no time per byte (none measured)"
    where = f"link {link['src']} -> {link['dst']} [{link['backend']}]"
    return f"{where}: latency {link['latency'] * 1e6:.1f} us, {per_byte}"


main = hydra_app("profile", writes=("graph.json", "profile.json"))(run)
