"""Keep numba's on-disk kernel cache consistent with the source of every kernel it inlines.

numba's ``cache=True`` keys a cached kernel by its own file's timestamp only: a kernel that calls a function of
another file (``decode._decode`` calls ``window.window_features``, which calls ``_op_kernel.fwd_place``) keeps
running the old callee after that file changed, until its own file changes too. A stale feature kernel silently
gives other placements than the code says (seen here while developing: a changed tie rule in ``window.py`` was
ignored by ``schedule``'s cached feature kernel). ``ensure_fresh()`` hashes the source of every package module
that compiles with ``cache=True`` and, when the hash differs from the one stamped beside the caches, deletes
those caches (``*.nbi`` / ``*.nbc`` in the package's ``__pycache__`` folders) before anything is compiled. It
runs once per process, on import of ``placement_rl.cost`` and ``placement_rl.baselines``; an unwritable install
is left alone (numba then recompiles in memory as usual).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PKG = Path(__file__).resolve().parent
STAMP = "placement_rl_kernels.stamp"
_DONE = False


def _kernel_files() -> list[Path]:
    out = []
    for f in sorted(PKG.rglob("*.py")):
        try:
            if "cache=True" in f.read_text(errors="ignore"):
                out.append(f)
        except OSError:
            continue
    return out


def source_stamp() -> str:
    h = hashlib.sha256()
    for f in _kernel_files():
        h.update(f.relative_to(PKG).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:24]


def ensure_fresh() -> bool:
    """Drop the package's numba caches if any kernel source changed since they were written; True if dropped."""
    global _DONE
    if _DONE:
        return False
    _DONE = True
    stamp = source_stamp()
    marker = PKG / "__pycache__" / STAMP
    try:
        if marker.is_file() and marker.read_text().strip() == stamp:
            return False
        for cache in PKG.rglob("__pycache__"):
            for f in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
                try:
                    f.unlink()
                except OSError:
                    pass
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_suffix(f".{hashlib.sha256(stamp.encode()).hexdigest()[:6]}.tmp")
        tmp.write_text(stamp + "\n")
        tmp.replace(marker)
        return True
    except OSError:
        return False


__all__ = ["ensure_fresh", "source_stamp"]
