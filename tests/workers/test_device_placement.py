"""Where a worker's tensors live: batches on the rank's device, optimizer state with its parameters,
per-phase peak memory. Found on the H200 (issue 7); the CPU checks keep the rules from regressing."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from verl.protocol import DataProto
from verl.utils import fsdp_utils
from verl.utils.device_memory import PhaseMemory
from verl.utils.host_memory import HostMemoryConfig, HostMemoryHook
from verl.utils.model_config import FSDPConfig
from verl.workers.fsdp_workers import _FSDPModelWorker, _on_device


def test_on_device_copies_and_leaves_the_callers_batch_alone():
    data = DataProto.from_dict(tensors={"input_ids": torch.arange(6).view(2, 3)},
                               non_tensors={"uid": ["a", "b"]}, meta_info={"temperature": 0.7})
    original = data.batch
    moved = _on_device(data)
    assert moved is not data and data.batch is original
    assert moved.batch["input_ids"].device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert list(moved.non_tensor_batch["uid"]) == ["a", "b"] and moved.meta_info["temperature"] == 0.7


@pytest.mark.parametrize("fsdp_config, moves", [
    (FSDPConfig(optimizer_offload=True, param_offload=False), True),
    (FSDPConfig(optimizer_offload=True, param_offload=True), True),  # the step runs on the GPU
    (FSDPConfig(optimizer_offload=True, offload_policy=True), False),  # AdamW steps on the CPU then
    (FSDPConfig(optimizer_offload=False, param_offload=False), False),
])
def test_optimizer_state_follows_the_parameters(fsdp_config, moves):
    assert _FSDPModelWorker._moves_optimizer(fsdp_config) is moves


@pytest.mark.parametrize("fsdp_config, moves", [
    (FSDPConfig(param_offload=True), True),
    (FSDPConfig(param_offload=False), False),
    (FSDPConfig(param_offload=True, offload_policy=True), False),  # never leave the host anyway
])
def test_parameters_move_between_phases_with_param_offload_only(fsdp_config, moves):
    assert _FSDPModelWorker._moves_parameters(fsdp_config) is moves


@pytest.fixture
def moves(monkeypatch) -> list[tuple[str, torch.device | None]]:
    """Where :func:`fsdp_utils.resident` sends a module: ``("load", device)`` / ``("offload", None)``,
    recorded instead of made."""
    record = []
    monkeypatch.setattr(fsdp_utils, "load_model", lambda model, device: record.append(("load", device)))
    monkeypatch.setattr(fsdp_utils, "offload_model", lambda model: record.append(("offload", None)))
    return record


def test_resident_loads_for_the_block_and_offloads_after_it_even_when_it_raises(moves):
    model, gpu = torch.nn.Linear(2, 2), torch.device("meta")  # any device that is not the host
    with fsdp_utils.resident(model, enabled=True, device=gpu):
        assert moves == [("load", gpu)]
    assert moves == [("load", gpu), ("offload", None)]
    moves.clear()
    with pytest.raises(RuntimeError, match="out of memory"):
        with fsdp_utils.resident(model, enabled=True, device=gpu):
            raise RuntimeError("out of memory")
    assert moves == [("load", gpu), ("offload", None)]
    moves.clear()
    with fsdp_utils.resident(model, enabled=False, device=gpu):
        pass
    assert moves == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-accelerator case")
def test_resident_without_an_accelerator_leaves_the_module_where_it_is(moves):
    assert fsdp_utils.accelerator() is None
    with fsdp_utils.resident(torch.nn.Linear(3, 2), enabled=True):
        pass
    assert moves == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-accelerator case")
def test_resident_without_an_accelerator_keeps_the_same_parameters_and_grads():
    model = torch.nn.Linear(3, 2)
    params = {name: (p, p.data_ptr()) for name, p in model.named_parameters()}
    with fsdp_utils.resident(model, enabled=True):
        out = model(torch.ones(1, 3))
    out.sum().backward()
    for name, p in model.named_parameters():
        assert p is params[name][0] and p.data_ptr() == params[name][1] and p.device.type == "cpu", name
        assert p.grad is not None, name


def test_phase_memory_reports_the_phase_peak_and_forgets_after_pop():
    tracker = PhaseMemory()
    with tracker.track("gen"):
        if torch.cuda.is_available():
            block = torch.ones(64 * 2**20 // 4, device="cuda")  # 64 MiB
        else:
            # an anonymous mapping of its own, touched: 64 MiB of new resident pages whatever the heap
            # kept from earlier tests (a freed heap block would be reused without raising the RSS)
            block = mmap.mmap(-1, 64 * 2**20)
            block.write(b"\x01" * len(block))
        del block  # freed before the phase ends: only the peak remembers it
    metrics = tracker.pop_metrics()
    if torch.cuda.is_available():
        assert metrics["perf/max_memory_allocated_gb/gen"] >= 64 / 1024
    elif os.path.exists("/proc/self/clear_refs"):
        # The high-water mark was reset at the phase start and saw the 64 MiB block.
        assert metrics["perf/cpu_peak_rss_gb/gen"] >= metrics["perf/cpu_rss_gb/gen"] + 60 / 1024
    assert tracker.pop_metrics() == {}


_MMAP_CHECK = """
import ctypes, ctypes.util, torch
from verl.utils.host_memory import host_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                 "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
blocks = lambda: libc.mallinfo2().hblks  # blocks glibc serves with their own mapping
warm = torch.ones(2 << 20); del warm  # an 8 MiB free: glibc's dynamic threshold rises above 4 MiB
with host_mmap_threshold(1 << 20) as applied:
    before = blocks(); inside = torch.ones(1 << 20); print("inside", blocks() - before, applied)
    del inside
before = blocks(); after = torch.ones(1 << 20); print("after", blocks() - before)
"""


def test_update_mmap_threshold_maps_mid_sized_tensors_only_inside_the_block():
    """A 4 MiB tensor gets its own mapping (freed straight back to the OS) only inside the block.

    Run in a fresh interpreter: in a long test session glibc may serve the tensor from a free
    chunk already in its heap, whatever the threshold.
    """
    import subprocess
    import sys

    if not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"):
        pytest.skip("needs glibc >= 2.33")
    out = subprocess.run([sys.executable, "-c", _MMAP_CHECK], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["inside", "1", "True", "after", "0"], out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host memory hook is CPU-only")
def test_host_memory_hook_trims_after_a_phase_and_sets_the_update_threshold_only_when_asked():
    hook = HostMemoryHook(HostMemoryConfig(trim_after_phase=True, update_mmap_threshold_mib=1))
    with hook.phase("gen"):
        block = torch.ones(64 * 2**20 // 4)
        del block
    assert set(hook.pop_metrics()) == {"perf/cpu_heap_trimmed_gb/gen"} and hook.pop_metrics() == {}
    with hook.update() as applied:
        assert applied
    quiet = HostMemoryHook(HostMemoryConfig(trim_after_phase=False))
    with quiet.phase("gen"):
        pass
    with quiet.update() as applied:
        assert not applied
    assert quiet.pop_metrics() == {}
