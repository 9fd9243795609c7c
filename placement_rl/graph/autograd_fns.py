"""The custom ``torch.autograd.Function`` classes a model differentiates through.

``torch.export`` and ``torch.fx`` trace through a Function's forward, so a captured graph prices autograd's
backward of those ops, and an executed program runs it, not the Function's own backward (a straight-through
estimator, a fused kernel): ``capture`` warns, the executors refuse. Functions defined in torch are left out:
those of ``torch.library`` custom ops (their registered backward is exported), of ``torch.cond`` / ``map`` and of
checkpointing (whose backward is autograd's of its forward).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Sequence

import torch
from torch import nn


def _walk(out) -> tuple[dict[type, None], set[int]]:
    """The Function classes (not torch's own) in the autograd graph of every tensor in ``out``, and the ids of the
    leaf tensors (parameters) it accumulates gradients into."""
    found: dict[type, None] = {}
    reached: set[int] = set()
    seen: set = set()  # the nodes themselves (torch hands out one Python object per node)
    stack = [t.grad_fn for t in torch.utils._pytree.tree_leaves(out)
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        leaf = getattr(fn, "variable", None)  # AccumulateGrad: a leaf that gets a gradient
        if leaf is not None:
            reached.add(id(leaf))
        cls = getattr(fn, "_forward_cls", None)
        if isinstance(fn, torch.autograd.function.BackwardCFunction) and cls is not None \
                and (getattr(cls, "__module__", "") or "").split(".")[0] != "torch":
            found[cls] = None
        stack.extend(g for g, _ in fn.next_functions)
    return found, reached


def custom_autograd_functions(module: nn.Module, inputs: Sequence[torch.Tensor]) -> list[type] | None:
    """The custom Function classes one forward of ``module(*inputs)`` differentiates through (sorted by name), or
    None where no forward runs (``_probe``)."""
    got = _probe(module, inputs)
    return None if got is None else sorted(got[0], key=lambda c: (c.__module__, c.__qualname__))


def params_without_grad(module: nn.Module, inputs: Sequence[torch.Tensor]) -> list[str] | None:
    """The trainable parameters one forward of ``module(*inputs)`` gives no gradient (used only through
    non-differentiable ops such as ``argmax``, or not at all), by name, or None where no forward runs. DDP leaves
    the other gradients of their bucket unaveraged (measured: 0.58 off on one step, a hang on the next)."""
    got = _probe(module, inputs)
    if got is None:
        return None
    return [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in got[1]]


def _probe(module: nn.Module, inputs: Sequence[torch.Tensor]) -> tuple[dict[type, None], set[int]] | None:
    """``_walk`` of one forward of ``module(*inputs)``, or None where none runs. The forward runs on fake tensors
    (no compute); where the model cannot (data-dependent code), on the real ones. The module is left as it was:
    buffers the forward updates (BatchNorm counters) and attributes it assigns (caches) are restored."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    saved = [(m, dict(vars(m)), dict(m._buffers), [(b, b.detach().clone()) for b in m._buffers.values()
                                                   if b is not None]) for m in module.modules()]
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            try:
                with _quiet("torch._subclasses.fake_tensor"), FakeTensorMode(allow_non_fake_inputs=True) as mode:
                    return _walk(module(*(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                                          for t in inputs)))
            except Exception:  # noqa: BLE001 -- data-dependent code: one real forward
                try:
                    return _walk(module(*inputs))
                except Exception:  # noqa: BLE001 -- the caller says what a model that does not run means
                    return None
    finally:
        with torch.no_grad():
            for m, attrs, bufs, values in saved:
                for k in set(vars(m)) - set(attrs):
                    del vars(m)[k]
                vars(m).update(attrs)
                m._buffers.clear()
                m._buffers.update(bufs)
                for b, value in values:
                    b.copy_(value)


@contextlib.contextmanager
def _quiet(logger: str):
    """``logger`` silent inside (fake tensors log an op they cannot run as an error with its traceback, though the
    probe then runs the real forward)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(level)


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
