"""Training state as one flat byte buffer: where each tensor sits, and the rest as a small skeleton.

A snapshot of model, optimizer, RNG and dataloader state is a nested structure of dicts, lists and
tuples whose leaves are tensors and small Python values (step counters, hyper-parameters). The
memory and peer tiers move bytes, so the tensors are laid out back to back (64-byte aligned, so a
slice can be viewed as any dtype) in one preallocated buffer; everything else stays in the
:class:`Layout`'s skeleton, which travels beside the buffer as a few kilobytes of pickle.

Unpacking returns tensors that are *views* of the buffer: loading them into the model copies once,
and nothing is allocated per snapshot.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Layout", "TensorSlot", "plan_layout", "pack", "unpack"]

ALIGN = 64


@dataclass(frozen=True, slots=True)
class TensorSlot:
    """One tensor's place in the buffer."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class _Ref:
    """Stands in the skeleton where tensor number ``index`` was."""

    index: int


@dataclass(frozen=True, slots=True)
class Layout:
    """The skeleton of a state and where its tensors sit in a buffer of ``nbytes``."""

    skeleton: Any
    slots: tuple[TensorSlot, ...]
    nbytes: int

    def same_shape(self, other: Layout | None) -> bool:
        """True when ``other`` places the same tensors at the same offsets (its buffer can be reused)."""
        return other is not None and self.slots == other.slots

    def to_bytes(self) -> bytes:
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def from_bytes(data: bytes) -> Layout:
        """The layout a rank of the same job wrote (node-local tier files or the job's own peer group)."""
        layout = pickle.loads(data)
        if not isinstance(layout, Layout):
            raise ValueError(f"not a snapshot layout: {type(layout).__name__}")
        return layout


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Ref(len(tensors) - 1)
    if isinstance(obj, dict):
        return type(obj)((k, _strip(v, tensors)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_strip(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_strip(v, tensors) for v in obj)
    return obj


def _fill(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Ref):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return type(obj)((k, _fill(v, tensors)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_fill(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_fill(v, tensors) for v in obj)
    return obj


def plan_layout(state: Any) -> tuple[Layout, list[torch.Tensor]]:
    """The layout of ``state`` and its tensors in buffer order."""
    tensors: list[torch.Tensor] = []
    skeleton = _strip(state, tensors)
    slots, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        slots.append(TensorSlot(t.dtype, tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return Layout(skeleton, tuple(slots), offset), tensors


def _views(layout: Layout, buf: torch.Tensor) -> Iterator[torch.Tensor]:
    for s in layout.slots:
        yield buf[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)


def pack(layout: Layout, tensors: list[torch.Tensor], buf: torch.Tensor, *,
         non_blocking: bool = False) -> None:
    """Copy ``tensors`` into their places in ``buf`` (uint8, at least ``layout.nbytes``)."""
    if buf.numel() < layout.nbytes:
        raise ValueError(f"buffer of {buf.numel()} bytes is smaller than the layout's {layout.nbytes}")
    for view, t in zip(_views(layout, buf), tensors, strict=True):
        view.copy_(t.detach(), non_blocking=non_blocking)


def unpack(layout: Layout, buf: torch.Tensor) -> Any:
    """The state ``layout`` describes, its tensors viewing ``buf`` (copy them before ``buf`` is reused)."""
    return _fill(layout.skeleton, list(_views(layout, buf)))
