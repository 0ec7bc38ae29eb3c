"""The optimizer state on the host between updates (``fsdp_config.optimizer_offload``), in one
page-locked host buffer kept from step to step (:class:`OptimizerOffload`)."""

from __future__ import annotations

import torch

from verl.utils.host_buffer import HostBuffer, local_shard, with_local


class OptimizerOffload:
    """An optimizer's state on the host between updates (veRL's ``fsdp_config.optimizer_offload``),
    in one page-locked host buffer that is kept from step to step.

    :meth:`offload` copies every state tensor on ``device`` into its slice of the buffer and points
    the state entry at that slice; :meth:`load` puts a device copy of each slice back. From
    page-locked memory both directions are asynchronous DMA, ordered on the current stream with the
    optimizer step, and nothing is allocated on the host per step (a fresh pageable ``.to("cpu")``
    per tensor faults in new host memory on every update and copies synchronously both ways).

    The buffer (:class:`~verl.utils.host_buffer.HostBuffer`) is allocated on the first :meth:`offload`,
    and again when the state's layout (which parameter, key, local shape, dtype) changed, e.g. after
    ``optimizer.load_state_dict``. It is exactly as large as the state (plus alignment) and
    page-locked on a GPU.

    FSDP2's state tensors are DTensors: the local shard is what is copied, and the entry stays a
    DTensor of the same mesh, placements, shape and stride, as ``value.to("cpu")`` leaves it.
    Scalars that live on the host already (AdamW's ``step``) are not touched.

    Args:
        optimizer: the optimizer whose ``state`` moves.
        device: where the state lives for a step (the rank's GPU). A CPU ``device`` makes both moves
            plain host copies, so a CPU-only machine can drive the whole cycle (tests); nothing is
            page-locked then.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: str | torch.device):
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.buffer = HostBuffer(page_lock=self.device.type == "cuda")

    @torch.no_grad()
    def offload(self) -> None:
        """Copy the state tensors on ``device`` into the host buffer; the entries become its views.

        Blocks until the copies have landed, so the host may read the state after it (a checkpoint).
        """
        entries = self._entries()
        if not entries:  # AdamW creates its state in the first step
            return
        slots = self.buffer.slots((index, key, tuple(local_shard(value).shape), local_shard(value).dtype)
                                  for index, key, _, value in entries)
        for (_, key, state, value), slot in zip(entries, slots):
            local = local_shard(value)
            if local.data_ptr() != slot.data_ptr():  # not offloaded already
                slot.copy_(local, non_blocking=True)
                state[key] = with_local(value, slot)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def load(self) -> None:
        """Put a ``device`` copy of each state tensor in the buffer back into the state (asynchronous
        from page-locked memory, ordered before the step on the current stream); the buffer is kept."""
        for _, key, state, value in self._entries():
            if self.buffer.holds(local_shard(value)) or value.device.type != self.device.type:
                state[key] = value.to(self.device, non_blocking=True, copy=True)

    def _entries(self) -> list[tuple[int, str, dict, torch.Tensor]]:
        """``(parameter index, key, state dict, tensor)`` of the tensors the buffer is for (all but the
        host scalars), in parameter order."""
        params = (p for group in self.optimizer.param_groups for p in group["params"])
        entries = []
        for index, param in enumerate(params):
            state = self.optimizer.state.get(param, {})
            for key in sorted(state):
                value = state[key]
                # host scalars (AdamW's ``step``) stay where the optimizer keeps them
                if torch.is_tensor(value) and (value.device.type == self.device.type or value.dim() > 0):
                    entries.append((index, key, state, value))
        return entries
