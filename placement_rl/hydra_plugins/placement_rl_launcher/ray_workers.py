"""``RayWorkersLauncher``: the class Hydra instantiates for ``hydra/launcher=ray_workers``, and its config in Hydra's
ConfigStore. A shim: the launcher is ``placement_rl.cli.sweep``."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher

from placement_rl.cli.sweep import NAME, RayWorkersConf

ConfigStore.instance().store(group="hydra/launcher", name=NAME, node=RayWorkersConf, provider="placement_rl")


class RayWorkersLauncher(Launcher):
    def __init__(self, workers: Any = "auto", address: Optional[str] = None) -> None:
        self.workers, self.address = workers, address
        self.config: Any = None
        self.task_function: Any = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        """Check the launcher's config before the sweeper writes anything: one line and exit code 2 if wrong."""
        from placement_rl.cli.common import fail
        from placement_rl.cli.sweep import check_launcher
        from placement_rl.errors import PlacementRLError

        try:
            self.workers, self.address = check_launcher(self.workers, self.address)
        except PlacementRLError as exc:
            fail(str(exc))
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from placement_rl.cli.sweep import launch

        return launch(self, job_overrides, initial_job_idx)
