"""placement-rl: learn where the parts of a deep-learning training step should run."""

__version__ = "0.1.0"

from placement_rl._jit_cache import ensure_fresh as _ensure_fresh_kernels

_ensure_fresh_kernels()  # numba's cache does not see a changed callee in another file: drop stale kernels first
