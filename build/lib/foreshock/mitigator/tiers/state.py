"""What a rank must get back to continue bit for bit: model, optimizer, RNG and dataloader position.

Model and optimizer go through ``torch.distributed.checkpoint.state_dict`` (which also
materialises an optimizer's lazily created state, so a template loaded before the first step has
every tensor). RNG states are tensors: torch's CPU and CUDA generators as they are, Python's and
NumPy's as fixed-size integer tensors, so every tier (the flat memory buffer, DCP on storage) carries them
the same way. A dataloader (or anything with ``state_dict``/``load_state_dict``, such as
torchdata's ``StatefulDataLoader``) keeps its position; a job that skips it repeats or skips
samples after a recovery.
"""

from __future__ import annotations

import math
import random
from typing import Any, Protocol

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

__all__ = ["Stateful", "TrainState"]

# Optimizer state keyed by parameter name ("state.<fqn>.momentum_buffer", "param_groups.<fqn>.lr"), as
# torchtitan does for pipeline stages: DCP keeps one entry per name, so a nested "param_groups" list
# that differs between ranks would be saved for one rank only.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def _rng_state() -> dict[str, Any]:
    version, words, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor(words, dtype=torch.int64),
        "python_gauss": torch.tensor([math.nan if gauss is None else gauss], dtype=torch.float64),
        "numpy": torch.from_numpy(keys.astype(np.int64)),
        "numpy_pos": torch.tensor([pos, has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([cached], dtype=torch.float64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].clone())
    gauss = float(state["python_gauss"][0])
    random.setstate((3, tuple(int(w) for w in state["python"]), None if math.isnan(gauss) else gauss))
    pos, has_gauss = (int(x) for x in state["numpy_pos"])
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), pos, has_gauss,
                         float(state["numpy_gauss"][0])))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.clone() for s in state["cuda"]])


def _clone(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return type(state)((k, _clone(v)) for k, v in state.items())
    if isinstance(state, list | tuple):
        return type(state)(_clone(v) for v in state)
    return state


class TrainState:
    """Capture and apply one rank's training state as a nested dict of tensors."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 dataloader: Stateful | None = None):
        self.model, self.optimizer, self.dataloader = model, optimizer, dataloader

    def capture(self) -> dict[str, Any]:
        """The live state; its model and optimizer tensors *are* the training tensors (copy to keep)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_OPTIONS)
        local = {"rng": _rng_state()}  # this rank's own, whatever the parallelism
        if self.dataloader is not None:
            local["loader"] = self.dataloader.state_dict()
        return {"model": model_sd, "optim": optim_sd, "local": local}

    def apply_view(self, state: dict[str, Any]) -> None:
        """:meth:`apply` a state whose tensors view a buffer that will be reused (a memory snapshot).

        The model's load copies into its parameters; an optimizer keeps the tensors it is given,
        so its part is copied first, or the next snapshot would overwrite its momentum.
        """
        self.apply({**state, "optim": _clone(state["optim"])})

    def apply(self, state: dict[str, Any]) -> None:
        """Load ``state`` (from :meth:`capture`, a memory snapshot or DCP) into every part."""
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=_OPTIONS)
        _set_rng_state(state["local"]["rng"])
        if self.dataloader is not None and "loader" in state["local"]:
            self.dataloader.load_state_dict(state["local"]["loader"])
