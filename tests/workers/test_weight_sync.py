"""The split pools' weight broadcast (``verl.workers.weight_sync``) between real processes, over gloo
(and over NCCL where there are two GPUs or more: one per process, as on the device's multi-GPU machines):
what the receivers get is what the sender sent (names, shapes, dtypes, values, in order), push after
push; the engine's dtype reaches the sender; a tensor unlike its spec is refused; a receiver that finds no group says where it looked."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch

from verl.workers import weight_sync


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _weights(push: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(push)
    return {"model.embed_tokens.weight": torch.randn(7, 4, generator=gen).to(torch.bfloat16),
            "model.norm.weight": torch.randn(4, generator=gen),
            "model.layers.0.step": torch.tensor([push, 3 * push], dtype=torch.int64)}


def _receiver(port: int, rank: int, world_size: int, pushes: int, use_gpu: bool, out) -> None:
    if use_gpu:
        torch.cuda.set_device(rank)
    group = weight_sync.WeightBroadcast("127.0.0.1", port, rank, world_size, use_gpu=use_gpu, timeout_s=60,
                                        engine_dtype=torch.bfloat16)
    out.put([[(name, tensor.cpu()) for name, tensor in group.receive()] for _ in range(pushes)])


GPUS = torch.cuda.device_count()


@pytest.mark.parametrize("use_gpu", [False, pytest.param(True, marks=pytest.mark.skipif(
    GPUS < 2, reason=f"NCCL between processes needs a GPU each (2 or more; this machine has {GPUS})"))],
    ids=["gloo", "nccl"])
def test_receivers_get_every_push_as_sent_and_the_sender_learns_the_engine_dtype(use_gpu):
    ctx = mp.get_context("spawn")
    port, out = _free_port(), ctx.Queue()
    world_size = min(3, GPUS) if use_gpu else 3
    receivers = [ctx.Process(target=_receiver, args=(port, rank, world_size, 2, use_gpu, out))
                 for rank in range(1, world_size)]
    for process in receivers:
        process.start()
    try:
        if use_gpu:
            torch.cuda.set_device(0)
        sender = weight_sync.WeightBroadcast("127.0.0.1", port, 0, world_size, use_gpu=use_gpu, timeout_s=60)
        assert sender.engine_dtype == torch.bfloat16
        sent = [_weights(1), _weights(2)]
        for weights in sent:
            nbytes = sender.send(weight_sync.specs_of(weights), iter(weights.values()))
            assert nbytes == sum(t.numel() * t.element_size() for t in weights.values())
        bad = weight_sync.TensorSpec("model.norm.weight", (4,), torch.float32)
        with pytest.raises(ValueError, match=r"model.norm.weight is \(5,\) torch.float32, its spec \(4,\)"):
            sender.send([bad], [torch.zeros(5)])  # refused before anything is sent
        for _ in receivers:
            got = out.get(timeout=60)
            for pushed, weights in zip(got, sent):
                assert [name for name, _ in pushed] == list(weights)
                for (_, tensor), expected in zip(pushed, weights.values()):
                    assert tensor.dtype == expected.dtype and torch.equal(tensor, expected)
    finally:
        for process in receivers:
            process.join(timeout=60)
    assert [process.exitcode for process in receivers] == [0] * (world_size - 1)


def test_state_specs_cast_floating_entries_only_and_keep_full_shapes():
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(torch.zeros(3, 2))
    module.register_buffer("count", torch.zeros(2, dtype=torch.int64))
    specs = weight_sync.state_specs(module, torch.bfloat16)
    assert specs == [weight_sync.TensorSpec("weight", (3, 2), torch.bfloat16),
                     weight_sync.TensorSpec("count", (2,), torch.int64)]


def test_a_receiver_without_a_sender_names_the_address_it_tried():
    port = _free_port()
    with pytest.raises(RuntimeError, match=rf"rank 1 of 2 could not join the group at 127.0.0.1:{port}"):
        weight_sync.WeightBroadcast("127.0.0.1", port, 1, 2, use_gpu=False, timeout_s=2)
