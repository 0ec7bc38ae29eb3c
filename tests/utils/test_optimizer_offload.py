"""``OptimizerOffload`` (``fsdp_config.optimizer_offload``) on a real FSDP2 model and a real AdamW.

Without an accelerator the host is named as the device, so both moves are real copies (the workers
never move the state there); with one, the same tests use the GPU and a page-locked buffer. Several
parameters share a shape and hold different values, so a copy that is skipped or lands in another
tensor's slice breaks bit-equality.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from verl.utils import fsdp_utils, optimizer_offload
from verl.utils.host_buffer import local_shard


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class TinyModel(nn.Module):
    """Three same-shaped blocks and a head, sharded per block as :func:`fsdp_utils.apply_fsdp2` does."""

    _no_split_modules = ["Block"]

    def __init__(self, width: int = 8):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(3))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


DEVICE = fsdp_utils.accelerator() or torch.device("cpu")


def _trainable(seed: int = 0) -> tuple[nn.Module, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = fsdp_utils.apply_fsdp2(TinyModel(), mixed_precision="fp32")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(16, 8, generator=gen).to(DEVICE)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state(optimizer: torch.optim.Optimizer) -> dict[tuple[int, str], torch.Tensor]:
    """``(parameter index, key)`` -> state tensor, in parameter order."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {(index, key): value for index, param in enumerate(params)
            for key, value in optimizer.state.get(param, {}).items()}


def _copy(state: dict) -> dict[tuple[int, str], torch.Tensor]:
    return {k: local_shard(v).clone() for k, v in state.items()}


def _storage(value: torch.Tensor) -> int:
    return local_shard(value).untyped_storage().data_ptr()


def _assert_equal(state: dict, expected: dict) -> None:
    assert state.keys() == expected.keys()
    for key, value in state.items():
        assert torch.equal(local_shard(value).cpu(), expected[key].cpu()), key


@pytest.fixture
def trained():
    """A model and its optimizer after two steps (the state exists), with an offload of it."""
    model, optimizer = _trainable()
    for step in range(2):
        _step(model, optimizer, step)
    return model, optimizer, optimizer_offload.OptimizerOffload(optimizer, DEVICE)


def test_offload_puts_the_state_in_one_buffer_and_load_brings_it_back_bit_equal(trained):
    _, optimizer, offload = trained
    before = _state(optimizer)
    moved = {k for k, v in before.items() if v.device.type == DEVICE.type}  # not AdamW's host step on a GPU
    assert {k for k in moved if k[1] == "exp_avg"} == {(i, "exp_avg") for i in range(8)}
    blocks = [before[(i, "exp_avg")] for i in (0, 2, 4)]  # the blocks' weights: same shape, other values
    assert not torch.equal(blocks[0].to_local(), blocks[1].to_local())
    expected = _copy(before)

    offload.offload()
    offloaded = _state(optimizer)
    _assert_equal(offloaded, expected)
    assert {_storage(offloaded[k]) for k in moved} == {offload.buffer.tensor.untyped_storage().data_ptr()}
    assert all(offloaded[k] is before[k] for k in before.keys() - moved)  # left where it was
    for key in moved:
        value, old = offloaded[key], before[key]
        assert value.device.type == "cpu" and type(value) is type(old)
        if isinstance(old, DTensor):  # as value.to("cpu") leaves it
            assert (value.device_mesh, value.placements, value.shape, value.stride()) == (
                old.device_mesh, old.placements, old.shape, old.stride())
        if DEVICE.type == "cuda":  # DTensor has no is_pinned: its local shard is the buffer's view
            assert (value.to_local() if isinstance(value, DTensor) else value).is_pinned()

    offload.load()
    loaded = _state(optimizer)
    _assert_equal(loaded, expected)
    assert all(loaded[k].device.type == DEVICE.type and not offload.buffer.holds(local_shard(loaded[k])) for k in moved)
    assert all(_storage(loaded[k]) != _storage(offloaded[k]) for k in moved)


def test_the_buffer_is_kept_across_steps_and_replaced_when_the_layout_changes(trained):
    model, optimizer, offload = trained
    offload.offload()
    buffer = offload.buffer.tensor
    offload.offload()  # already offloaded: nothing to copy
    assert offload.buffer.tensor is buffer
    offload.load()
    _step(model, optimizer, 2)
    expected = _copy(_state(optimizer))
    offload.offload()
    assert offload.buffer.tensor is buffer and offload.buffer.tensor.data_ptr() == buffer.data_ptr()
    _assert_equal(_state(optimizer), expected)

    optimizer.load_state_dict(optimizer.state_dict())  # a checkpoint's load: same layout
    offload.offload()
    assert offload.buffer.tensor is buffer
    _assert_equal(_state(optimizer), expected)

    other = torch.optim.AdamW(model.parameters(), lr=1e-2)  # state for the head only
    model(torch.ones(2, 8, device=DEVICE)).sum().backward()
    for param in list(model.parameters())[:-2]:
        param.grad = None
    other.step()
    optimizer.load_state_dict(other.state_dict())
    expected = _copy(_state(optimizer))
    assert {index for index, _ in expected} == {6, 7}
    offload.offload()
    assert offload.buffer.tensor is not buffer and offload.buffer.tensor.numel() < buffer.numel()
    _assert_equal(_state(optimizer), expected)


def test_training_with_offload_between_steps_is_bit_identical():
    results = []
    for moves in (False, True):
        model, optimizer = _trainable()
        offload = optimizer_offload.OptimizerOffload(optimizer, DEVICE)
        for step in range(4):
            if moves:
                offload.load()
            _step(model, optimizer, step)
            if moves:
                offload.offload()
        offload.load()
        results.append(([p.full_tensor() for p in model.parameters()], _copy(_state(optimizer))))
    (params, state), (params_moved, state_moved) = results
    assert all(torch.equal(a, b) for a, b in zip(params, params_moved))
    _assert_equal(state_moved, state)
