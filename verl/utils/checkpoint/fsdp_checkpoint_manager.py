"""Save and restore an FSDP2 worker's full training state; export a Hugging Face folder.

Layout written into the folder the caller gives (the trainer makes it atomic by writing a tmp
folder and renaming it)::

    <local_path>/
        model_optim/                       torch.distributed.checkpoint (DCP) shards of the model
                                           and optimizer state (reshardable: resume on another
                                           world size works)
        extra_state_world_size_W_rank_R.pt LR scheduler, RNG states (python, numpy, torch, cuda)
                                           and the global step, one file per rank
        huggingface/                       config + tokenizer (weights only via :meth:`export_hf`)

Every method is collective: all ranks call it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from verl.utils.fsdp_utils import get_full_state_dict

MODEL_OPTIM_DIR = "model_optim"


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rng_state() -> dict[str, Any]:
    """RNG states of this process: python, numpy, torch CPU and (if present) CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states captured by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class FSDPCheckpointManager:
    """Checkpoint one FSDP2 model with its optimizer and LR scheduler.

    Args:
        model: the (sharded) model.
        optimizer, lr_scheduler: may be None (e.g. a frozen model).
        tokenizer: saved beside the exported config so the folder is self-contained.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 lr_scheduler: Any = None, tokenizer: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.tokenizer = tokenizer

    def _state(self) -> dict[str, Any]:
        optimizers = [self.optimizer] if self.optimizer is not None else []
        model_sd, optim_sd = get_state_dict(self.model, optimizers, options=StateDictOptions())
        state = {"model": model_sd}
        if self.optimizer is not None:
            state["optimizer"] = optim_sd
        return state

    def save(self, local_path: str | os.PathLike, global_step: int | None = None) -> None:
        """Write model + optimizer shards, per-rank extra state, and the HF config/tokenizer."""
        rank, world = _rank_world()
        path = Path(local_path)
        if rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        _barrier()
        dcp.save(self._state(), checkpoint_id=str(path / MODEL_OPTIM_DIR))
        extra = {"rng": rng_state(), "global_step": global_step,
                 "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None}
        torch.save(extra, path / f"extra_state_world_size_{world}_rank_{rank}.pt")
        if rank == 0:
            self._save_config(path / "huggingface")
        _barrier()

    def load(self, local_path: str | os.PathLike) -> int | None:
        """Restore what :meth:`save` wrote; returns the saved global step (or None).

        RNG and scheduler states come from this rank's file; when the world size changed, rank 0's
        file of the old run is not there and RNG/scheduler state is restored from rank 0 of the
        saved run when present.

        Raises:
            FileNotFoundError: the folder has no ``model_optim`` shards.
        """
        rank, world = _rank_world()
        path = Path(local_path)
        if not (path / MODEL_OPTIM_DIR).is_dir():
            raise FileNotFoundError(f"no checkpoint shards at {path / MODEL_OPTIM_DIR}")
        state = self._state()
        dcp.load(state, checkpoint_id=str(path / MODEL_OPTIM_DIR))
        optimizers = [self.optimizer] if self.optimizer is not None else []
        set_state_dict(self.model, optimizers, model_state_dict=state["model"],
                       optim_state_dict=state.get("optimizer", {}))
        extra_file = path / f"extra_state_world_size_{world}_rank_{rank}.pt"
        if not extra_file.exists():
            candidates = sorted(path.glob("extra_state_world_size_*_rank_0.pt"))
            extra_file = candidates[0] if candidates else None
        if extra_file is None:
            return None
        extra = torch.load(extra_file, weights_only=False)
        if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        set_rng_state(extra["rng"])
        return extra.get("global_step")

    def _save_config(self, hf_dir: Path) -> None:
        hf_dir.mkdir(parents=True, exist_ok=True)
        self.model.config.save_pretrained(hf_dir)
        generation_config = getattr(self.model, "generation_config", None)
        if generation_config is not None:
            generation_config.save_pretrained(hf_dir)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(hf_dir)

    def export_hf(self, path: str | os.PathLike) -> None:
        """Write a ``from_pretrained``-loadable folder (rank 0): config, tokenizer, full weights.

        Weights are gathered unsharded to rank 0 in fp32 on CPU and written as one
        ``model.safetensors``; tied weights (``lm_head`` = embeddings) are stored once.
        """
        from safetensors.torch import save_file

        state = get_full_state_dict(self.model)
        rank, _ = _rank_world()
        if rank == 0:
            path = Path(path)
            self._save_config(path)
            for key in _tied_keys(self.model):
                state.pop(key, None)
            save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"),
                      metadata={"format": "pt"})
        _barrier()


def _tied_keys(model: nn.Module) -> list[str]:
    """State-dict keys that duplicate another parameter when the config ties embeddings."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return []
    tied = getattr(model, "_tied_weights_keys", None) or []
    return list(tied.keys()) if isinstance(tied, dict) else list(tied)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
