"""The (graph, topology) pairs a learned placer is trained, developed and judged on, as plain specs.

A spec is a plain dict (``{"graph": {...}, "topology": preset | {"preset": name, "link_scale": f} | {"random":
seed, "devices": [lo, hi], "link_scale": f}, "id": ...}``) so task building can run in worker processes.

* ``training_specs``: synthetic DAG families ``layered``, ``transformer_like``, ``cnn_like``, ``dataflow`` at
  16-1,000 nodes (log-uniform) and the zoo models ``mlp``, ``resnet18``, ``gpt``, ``nmt``, each on a freshly
  drawn random cluster (``envs.topology_sampler``). No preset topology is ever trained on.
* ``dev`` (``heldout_specs``, 32 pairs): every choice is made on it (recipes, windows, checkpoints).
* ``test2024`` (``test_specs``, 32 pairs): the former test split. It was used for choices (policy iteration and RL
  switched off on its evidence, its tables regenerated many times as the recipe changed), so it is a second dev
  split now and reported as such.
* ``test`` (``fresh_test_specs``, 32 pairs, seed 20261128 never used before): looked at once, for the final
  figures. Eight graphs (``series_parallel``, a family never trained on; ``transformer_like``, ``dataflow`` and
  ``cnn_like`` at sizes drawn fresh; three HuggingFace models never trained on, built from their library configs
  cut to 2 layers, at operator level (not coarsened): Qwen2, T5 and ViT; and the zoo's ``gpt`` at operator level,
  never coarsened, 4 layers) on four clusters no policy was trained on: the DGX A100 preset; a random cluster
  drawn with links that differ pair by pair (a non-uniform ``topology_sampler`` pattern); and two
  communication-heavy ones: the DGX-1 hybrid cube-mesh and a random cluster with every link 4x slower (``link_scale =
  1/4``), where a typical edge's transfer takes longer than its producer's compute (``comm_ratio`` >= 1 in the
  task's meta: the median over edges of transfer time on the mean link over the producer's forward on the mean
  device).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placement_rl.envs.topology_sampler import PATTERNS, random_topology
from placement_rl.errors import ConfigError
from placement_rl.graph.spec import graph_from_spec
from placement_rl.topology import DeviceTopology, load_topology

TRAIN_FAMILIES = ("layered", "transformer_like", "cnn_like", "dataflow")
TRAIN_ZOO = ("mlp", "resnet18", "gpt", "nmt")
HELDOUT_TOPOLOGIES = ("4x_v100_nvlink", "2x4_v100_ib", "8x_a100_nvswitch", "cpu_2gpu")
HELDOUT_ZOO = ("resnet50", "inception", "moe", "bert_hf")
TEST_TOPOLOGIES = ("8x_v100_dgx1", "4x_v100_pcie", "4x_h100_nvlink", "8x_h100_dgx")
TEST_ZOO = ("llama_hf", "opt_hf", "gpt2_hf", "mixtral_hf")
FRESH_SEED = 20261128
FRESH_HF = {"qwen2": {"num_hidden_layers": 2}, "t5": {"num_layers": 2, "num_decoder_layers": 2},
            "vit": {"num_hidden_layers": 2}}
COMM_LINK_SCALE = 1.0 / 4


def training_specs(n: int, *, seed: int = 0, size: tuple[int, int] = (16, 1000), zoo_frac: float = 0.15,
                   devices: tuple[int, int] = (2, 16)) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        topo = {"random": int(rng.integers(2**31)), "devices": list(devices)}
        if rng.random() < zoo_frac:
            graph: dict[str, Any] = {"zoo": TRAIN_ZOO[int(rng.integers(len(TRAIN_ZOO)))]}
        else:
            nn_ = int(np.exp(rng.uniform(np.log(size[0]), np.log(size[1]))))
            graph = {"family": TRAIN_FAMILIES[int(rng.integers(len(TRAIN_FAMILIES)))], "num_nodes": nn_,
                     "seed": int(rng.integers(2**31))}
        out.append({"graph": graph, "topology": topo, "id": f"train{i}"})
    return out


def heldout_specs(*, seed: int = 12345, hf: bool = True) -> list[dict[str, Any]]:
    """The dev split: 32 (graph, topology) pairs (28 without the ``hf`` extra's bert_hf)."""
    rng = np.random.default_rng(seed)
    graphs: list[dict[str, Any]] = []
    for _ in range(2):
        graphs.append({"family": "series_parallel", "num_nodes": int(rng.integers(100, 600)),
                       "seed": int(rng.integers(2**31))})
    graphs.append({"family": "layered", "num_nodes": int(rng.integers(600, 1000)), "seed": int(rng.integers(2**31))})
    graphs.append({"family": "dataflow", "num_nodes": int(rng.integers(600, 1000)), "seed": int(rng.integers(2**31))})
    zoo = [z for z in HELDOUT_ZOO if hf or not z.endswith("_hf")]
    graphs += [{"zoo": z} for z in zoo]
    return _cross(graphs, HELDOUT_TOPOLOGIES)


def test_specs(*, seed: int = 777, hf: bool = True) -> list[dict[str, Any]]:
    """The former test split (32 pairs; 16 without the ``hf`` extra), a second dev split now (module doc)."""
    rng = np.random.default_rng(seed)
    graphs: list[dict[str, Any]] = []
    for _ in range(2):
        graphs.append({"family": "series_parallel", "num_nodes": int(rng.integers(200, 600)),
                       "seed": int(rng.integers(2**31))})
    for fam in ("transformer_like", "cnn_like"):
        graphs.append({"family": fam, "num_nodes": int(rng.integers(1100, 1500)), "seed": int(rng.integers(2**31))})
    graphs += [{"zoo": z, "coarsen": False} for z in TEST_ZOO if hf]
    return _cross(graphs, TEST_TOPOLOGIES)


def _hetero_seed(rng: np.random.Generator, devices: tuple[int, int]) -> int:
    """A random cluster seed whose links differ pair by pair (a non-uniform pattern, more than one GPU host or an
    island / mesh inside one) and whose devices keep their full memories (every test graph fits)."""
    for _ in range(1000):
        s = int(rng.integers(2**31))
        topo = random_topology(np.random.default_rng(s), devices)
        if any(p in topo.name for p in PATTERNS[1:]) and "_mem" not in topo.name:
            return s
    raise RuntimeError("no heterogeneous-link cluster in 1000 draws")  # pragma: no cover - PATTERN_P > 0


def fresh_test_specs(*, seed: int = FRESH_SEED, hf: bool = True) -> list[dict[str, Any]]:
    """The test split (32 pairs; 24 without the ``hf`` extra), touched once for the final figures (module doc)."""
    rng = np.random.default_rng(seed)
    graphs: list[dict[str, Any]] = [
        {"family": "series_parallel", "num_nodes": int(rng.integers(300, 700)), "seed": int(rng.integers(2**31))},
        {"family": "transformer_like", "num_nodes": int(rng.integers(300, 700)), "seed": int(rng.integers(2**31))},
        {"family": "dataflow", "num_nodes": int(rng.integers(200, 500)), "seed": int(rng.integers(2**31))},
        {"family": "cnn_like", "num_nodes": int(rng.integers(500, 900)), "seed": int(rng.integers(2**31))},
        {"zoo": "gpt", "coarsen": False, "overrides": {"n_layers": 4}},
    ]
    if hf:
        graphs += [{"hf": m, "overrides": ov} for m, ov in FRESH_HF.items()]
    topologies: list[Any] = [
        "8x_a100_dgx",
        {"random": _hetero_seed(rng, (6, 12)), "devices": [6, 12]},
        {"preset": "8x_v100_dgx1", "link_scale": COMM_LINK_SCALE},
        {"random": _hetero_seed(rng, (4, 8)), "devices": [4, 8], "link_scale": COMM_LINK_SCALE},
    ]
    return _cross(graphs, topologies)


def _cross(graphs: list[dict[str, Any]], topologies: list[Any]) -> list[dict[str, Any]]:
    out = []
    for g in graphs:
        for t in topologies:
            name = g.get("zoo") or (f"hf:{g['hf']}" if "hf" in g else f"{g['family']}-{g['num_nodes']}")
            out.append({"graph": g, "topology": t, "id": f"{name}@{topology_label(t)}"})
    return out


def topology_label(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    base = spec.get("preset") or f"rand{spec['random'] % 10_000}"
    scale = spec.get("link_scale")
    return f"{base}" + (f"/links{1 / scale:g}" if scale else "")


SPLITS = ("dev", "test2024", "test")


def split_specs(split: str) -> list[dict[str, Any]]:
    """``dev`` (every choice is made on it), ``test2024`` (the former test split, a second dev split) or ``test``
    (the fresh split: final figures only)."""
    if split == "dev":
        return heldout_specs()
    if split == "test2024":
        return test_specs()
    if split == "test":
        return fresh_test_specs()
    raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


def graph_of(spec: dict[str, Any]):
    if "zoo" in spec:
        return graph_from_spec({"source": "zoo", "name": spec["zoo"], "overrides": dict(spec.get("overrides") or {}),
                                "coarsen": {"enabled": bool(spec.get("coarsen", True))}})
    if "hf" in spec:
        return graph_from_spec({"source": "hf", "model_type": spec["hf"],
                                "overrides": dict(spec.get("overrides") or {}),
                                "coarsen": {"enabled": "max_nodes" in spec, "max_nodes": spec.get("max_nodes")}})
    return graph_from_spec({"source": "synthetic", "family": spec["family"], "num_nodes": spec["num_nodes"],
                            "seed": spec["seed"]})


def scale_links(topology: DeviceTopology, factor: float) -> DeviceTopology:
    """The same cluster with every link's bandwidth times ``factor`` (latencies kept)."""
    d = topology.to_dict()
    links = d.get("links") or {}
    for key in ("intra_host", "inter_host"):
        if isinstance(links.get(key), dict) and "bandwidth" in links[key]:
            links[key]["bandwidth"] = float(links[key]["bandwidth"]) * factor
    for p in links.get("pairs") or []:
        p["bandwidth"] = float(p["bandwidth"]) * factor
    return DeviceTopology.from_dict({**d, "name": f"{topology.name}/links{1 / factor:g}", "links": links})


def topology_of(spec: Any) -> DeviceTopology:
    if isinstance(spec, str):
        return load_topology(spec)
    if "preset" in spec:
        topo = load_topology(spec["preset"])
    else:
        topo = random_topology(np.random.default_rng(spec["random"]), tuple(spec.get("devices", (2, 16))))
    scale = spec.get("link_scale")
    return scale_links(topo, float(scale)) if scale else topo


def comm_ratio(graph, costs) -> float:
    """Median over edges of the transfer time on the mean link (latency + bytes / bandwidth, distinct devices)
    over the producer's forward time on the mean device: >= 1 on a communication-heavy pair."""
    d = costs.num_devices
    if graph.num_edges == 0 or d < 2:
        return 0.0
    off = ~np.eye(d, dtype=bool)
    lat = float(costs.link_latency[off].mean())
    inv_bw = float((1.0 / costs.link_bandwidth[off]).mean())
    src = graph.edges[:, 0]
    comp = costs.fwd_time.mean(axis=1)[src]
    xfer = lat + graph.edge_bytes * inv_bw
    return float(np.median(xfer / np.maximum(comp, 1e-12)))


__all__ = ["SPLITS", "comm_ratio", "fresh_test_specs", "graph_of", "heldout_specs", "scale_links", "split_specs",
           "test_specs", "topology_of", "training_specs"]
