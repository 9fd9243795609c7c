"""How many devices one op-level decode decides over: its schedule state's arrays and its time grow as the devices
squared (``cost.schedule``), so past ``MAX_DEVICES`` a run would not finish (4,096 H100s ran out of time and
memory in silence) and is refused at once."""

from __future__ import annotations

from placement_rl.errors import ConfigError
from placement_rl.topology import DeviceTopology

MAX_DEVICES = 1024  # 1,024 devices: the policy's greedy decode of a 34-node graph 48 s and 1.5 GB on 2 cores


def check_devices(topology: DeviceTopology) -> None:
    """``ConfigError`` when the topology has more devices than an op-level placement decides over."""
    d = topology.num_devices
    if d > MAX_DEVICES:
        raise ConfigError(f"topology '{topology.name}' has {d} devices: op-level placement (the policy, la_rule, "
                          f"the searches) decides over at most {MAX_DEVICES}, its time and memory growing as the "
                          "devices squared (1,024: 48 s and 1.5 GB for 34 nodes on 2 cores); place on fewer devices "
                          "(one host or group) or plan stages (evaluate suite=single)")


__all__ = ["MAX_DEVICES", "check_devices"]
