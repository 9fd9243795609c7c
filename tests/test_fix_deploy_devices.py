"""Ranks stand for the plan's devices: ``_mesh.rank_devices`` / ``cuda_binding`` (which GPU a rank binds to, pure),
``job.json``'s ``rank_devices`` and each rank's ``plan_device`` in the result (gloo on CPU for the run)."""

from __future__ import annotations

import json

import pytest
import torch

from placement_rl.plans import StagePlan
from placement_rl.topology import DeviceTopology

torch.set_num_threads(1)


def _gpus(count: int = 4, hosts: int = 1) -> DeviceTopology:
    per = count // hosts
    devices = [{"name": f"n{h}_gpu", "count": per, "kind": "gpu", "host": h, "peak_flops": 1e13,
                "mem_bandwidth": 1e12, "memory_bytes": 2 ** 34} for h in range(hosts)]
    return DeviceTopology.from_dict({"name": "gpus", "devices": devices,
                                     "links": {"intra_host": {"bandwidth": 1e11, "latency": 1e-6}}}, where="test")


def _dev(name: str, torch_device: str, host: int = 0) -> dict:
    return {"name": name, "torch_device": torch_device, "host": host}


def test_rank_devices_follow_the_mesh_and_the_plans_groups():
    from placement_rl.executor._mesh import parallel_dims, rank_devices

    plan = StagePlan(stage_of_node=[0, 1], stage_devices=[(3, 1), (2, 0)], num_microbatches=2)
    assert rank_devices(plan, parallel_dims(plan)) == (3, 2, 1, 0)
    tp = StagePlan(stage_of_node=[0, 1], stage_devices=[(2, 3), (0, 1)], tp=(2, 2), num_microbatches=2)
    assert rank_devices(tp, parallel_dims(tp)) == (2, 3, 0, 1)


def test_plan_devices_of_ranks_name_the_torch_device_and_host():
    from placement_rl.executor._mesh import parallel_dims
    from placement_rl.executor.distributed import plan_devices_of_ranks

    topo = _gpus(4)
    plan = StagePlan(stage_of_node=[0, 1], stage_devices=[(2,), (3,)], num_microbatches=2)
    assert plan_devices_of_ranks(plan, parallel_dims(plan), topo) == [_dev("n0_gpu2", "cuda:2"),
                                                                      _dev("n0_gpu3", "cuda:3")]


def test_a_rank_binds_to_its_plan_devices_gpu():
    from placement_rl.executor._mesh import cuda_binding

    devices = [_dev("gpu2", "cuda:2"), _dev("gpu3", "cuda:3")]
    assert cuda_binding(devices, rank=0, local_rank=0, local_world=2, device_count=4) == (2, "")
    assert cuda_binding(devices, rank=1, local_rank=1, local_world=2, device_count=4) == (3, "")
    # two nodes of two ranks: node 1 holds ranks 2 and 3 (host 1, cuda:1 and cuda:0)
    two = [_dev("a0", "cuda:0"), _dev("a1", "cuda:1"), _dev("b1", "cuda:1", 1), _dev("b0", "cuda:0", 1)]
    assert cuda_binding(two, rank=2, local_rank=0, local_world=2, device_count=2) == (1, "")
    assert cuda_binding(two, rank=3, local_rank=1, local_world=2, device_count=2) == (0, "")


@pytest.mark.parametrize("devices, local_world, count, says", [
    (None, 2, 4, "names no plan device"),
    ([_dev("gpu6", "cuda:6"), _dev("gpu7", "cuda:7")], 2, 4, "'gpu6' is cuda:6, not a CUDA index below 4"),
    ([_dev("cpu0", "cpu"), _dev("cpu1", "cpu")], 2, 4, "'cpu0' is cpu"),
    ([_dev("a", "cuda:0"), _dev("b", "cuda:0", 1)], 2, 4, "not distinct GPUs of one host"),
    ([_dev("a", "cuda:0")], 2, 4, "names plan devices for 1 ranks"),
])
def test_a_rank_falls_back_to_local_rank_with_a_note(devices, local_world, count, says):
    from placement_rl.executor._mesh import cuda_binding

    index, note = cuda_binding(devices, rank=1, local_rank=1, local_world=local_world, device_count=count)
    assert index == 1 and says in note and "\n" not in note


@pytest.fixture(scope="module")
def mlp():
    from placement_rl.graph import zoo
    from placement_rl.graph.capture import capture_zoo

    return capture_zoo("mlp", **zoo.tiny("mlp"))


def _plan(graph) -> StagePlan:
    n = graph.num_nodes
    return StagePlan(stage_of_node=[0 if i < n // 2 else 1 for i in range(n)], stage_devices=[(1,), (0,)],
                     num_microbatches=2)


def test_the_job_names_every_ranks_plan_device(mlp, tmp_path):
    from placement_rl.executor.distributed import DeployConfig, DeploySpec, prepare_job
    from placement_rl.topology import load_topology

    topo = load_topology("2x_cpu")
    prepare_job([DeploySpec(plan=_plan(mlp), graph=mlp, model="mlp", topology=topo)],
                config=DeployConfig(device="cpu"), job_dir=tmp_path / "job")
    job = json.loads((tmp_path / "job" / "job.json").read_text())
    assert job["rank_devices"] == [_dev("cpu1", "cpu"), _dev("cpu0", "cpu")]
    prepare_job([DeploySpec(plan=_plan(mlp), graph=mlp, model="mlp")], config=DeployConfig(device="cpu"),
                job_dir=tmp_path / "bare")  # no topology: no names
    assert json.loads((tmp_path / "bare" / "job.json").read_text())["rank_devices"] is None


@pytest.mark.slow
@pytest.mark.distributed
def test_each_rank_reports_the_plan_device_it_stands_for(mlp, tmp_path):
    from placement_rl.executor.distributed import DeployConfig, deploy_stage_plan
    from placement_rl.topology import load_topology

    res = deploy_stage_plan(_plan(mlp), mlp, model="mlp", topology=load_topology("2x_cpu"),
                            config=DeployConfig(steps=1, warmup=0, device="cpu", timeout_s=120))
    assert [(r["rank"], r["plan_device"], r["device"]) for r in res.ranks] == [(0, "cpu1", "cpu"), (1, "cpu0", "cpu")]
