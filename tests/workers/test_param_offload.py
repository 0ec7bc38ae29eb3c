"""``fsdp_config.param_offload`` (veRL's: the module on the host between phases, each phase on the
GPU) and ``offload_policy`` (FSDP2's CPUOffloadPolicy) on real FSDP2 workers (world of one, gloo).

Without an accelerator :func:`verl.utils.fsdp_utils.resident` is a no-op; there the parity tests
name the host as the accelerator, so every phase still goes through the real move path
(``FSDPModule._apply`` and its re-registration of the shards), and a tracker checks that each
forward, ``state_dict`` and ``load_state_dict`` of an offloaded module runs while it is resident.
On a CPU-only machine the copy between two real devices stays unchecked; on a GPU the same tests
make it.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy

from verl.utils import fsdp_utils
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker


class ResidencyTracker:
    """Sends :func:`fsdp_utils.resident` through its move path (to the GPU, or to the host as the
    device on a CPU-only machine) and records which modules it holds resident; a use of a watched
    module outside that is a miss."""

    def __init__(self, monkeypatch):
        self.resident: set[int] = set()
        self.loads = 0
        self.offloaded: set[int] = set()  # modules offload_model was called on
        self.misses: list[str] = []
        load, offload = fsdp_utils.load_model, fsdp_utils.offload_model

        def tracked_load(model, device):
            assert id(model) not in self.resident, "resident() entered twice for one module"
            self.resident.add(id(model))
            self.loads += 1
            load(model, device)

        def tracked_offload(model):
            self.resident.discard(id(model))
            self.offloaded.add(id(model))
            offload(model)

        device = fsdp_utils.accelerator() or torch.device("cpu")
        monkeypatch.setattr(fsdp_utils, "accelerator", lambda: device)
        monkeypatch.setattr(fsdp_utils, "load_model", tracked_load)
        monkeypatch.setattr(fsdp_utils, "offload_model", tracked_offload)

    def watch(self, module: torch.nn.Module, name: str) -> None:
        assert id(module) in self.offloaded, f"{name} was not sent to the host after it was built"
        assert {p.device.type for p in module.parameters()} == {"cpu"}, name

        def check(use: str):
            def hook(*_args, **_kwargs):
                if id(module) not in self.resident:
                    self.misses.append(f"{name}.{use}")
            return hook

        module.register_forward_pre_hook(check("forward"))
        module.register_state_dict_pre_hook(check("state_dict"))
        module.register_load_state_dict_pre_hook(check("load_state_dict"))

    def assert_clean(self) -> None:
        assert self.loads > 0, "no phase went through resident()"
        assert not self.misses, f"used outside its residency: {sorted(set(self.misses))}"
        assert not self.resident, "a module was left on the device after its phase"


def _fsdp_config(variant: str, **extra) -> dict:
    return {"param_offload": variant == "param_offload", "offload_policy": variant == "offload_policy", **extra}


def _actor_run(config: dict, batch_factory, tmp_path, tracker: ResidencyTracker | None) -> dict:
    torch.manual_seed(0)
    worker = ActorRolloutRefWorker(config, role="actor_rollout_ref")
    worker.init_model()
    if tracker is not None:
        tracker.watch(worker.actor_module, "actor")
        if worker.ref_module is not None:
            tracker.watch(worker.ref_module, "ref")
    data = batch_factory(num_rows=6, seed=3)
    out = {"old_log_probs": worker.compute_log_prob(data).batch["old_log_probs"],
           "ref_log_probs": worker.compute_ref_log_prob(data).batch["ref_log_probs"]}
    data.batch["old_log_probs"], data.batch["ref_log_probs"] = out["old_log_probs"], out["ref_log_probs"]
    out["metrics_1"] = worker.update_actor(data).meta_info["metrics"]
    worker.save_checkpoint(str(tmp_path / "ckpt"), global_step=1)
    out["metrics_2"] = worker.update_actor(data).meta_info["metrics"]  # with optimizer state
    with worker._actor_resident():
        out["params_2"] = {k: v.clone() for k, v in fsdp_utils.iter_full_params(worker.actor_module)}
    out["engine_2"] = {k: v.clone() for k, v in worker.rollout_engine.model.state_dict().items()}
    worker.load_checkpoint(str(tmp_path / "ckpt"))
    out["after_load"] = worker.compute_log_prob(data).batch["old_log_probs"]
    worker.export_hf(str(tmp_path / "hf"))
    if tracker is not None:
        tracker.assert_clean()
    out["modules"] = (worker.actor_module, worker.ref_module)
    return out


def _assert_same_training(got: dict, expected: dict, exact: bool = True) -> None:
    """Bit-identical (``exact``), or equal up to float summation order: FSDP2's CPU offload computes
    the grad norm and the AdamW step on the host, where a GPU run computes them on the GPU."""
    def same(a, b, what, bf16=False):
        if exact:
            assert torch.equal(torch.as_tensor(a), torch.as_tensor(b)), what
        else:  # one bfloat16 rounding step apart at most where the engine holds bf16 weights
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-2 if bf16 else 1e-5,
                                       atol=1e-6, msg=lambda m: f"{what}: {m}")

    for key in ("old_log_probs", "ref_log_probs", "after_load"):
        assert torch.equal(got[key], expected[key]), key
    for step in ("metrics_1", "metrics_2"):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
            same(got[step][key], expected[step][key], (step, key))
    for store in ("params_2", "engine_2"):
        assert got[store].keys() == expected[store].keys()
        for name, tensor in got[store].items():
            same(tensor, expected[store][name], (store, name), bf16=store == "engine_2")


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_actor_trains_the_same_with_param_offload(lora_rank, tiny_qwen_path, configs, batch_factory, tmp_path,
                                                 monkeypatch):
    """Log-probs, reference, two updates, the engine's weights, checkpoint and export: bit-identical
    with the module moved in and out around every phase; with LoRA the reference is the actor."""
    def config(variant: str) -> dict:
        cfg = configs[0](tiny_qwen_path, fsdp_config=_fsdp_config(variant, optimizer_offload=True,
                                                                  mixed_precision="bf16"))
        cfg["ref"]["fsdp_config"] = _fsdp_config(variant)
        if lora_rank:
            cfg["model"].update(lora_rank=lora_rank, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        return cfg

    expected = _actor_run(config("resident"), batch_factory, tmp_path / "resident", None)
    tracker = ResidencyTracker(monkeypatch)
    got = _actor_run(config("param_offload"), batch_factory, tmp_path / "offload", tracker)
    _assert_same_training(got, expected)


def test_offload_policy_shards_with_fsdp2_cpu_offload_and_trains_the_same(tiny_qwen_path, configs, batch_factory,
                                                                         tmp_path):
    def config(variant: str) -> dict:
        cfg = configs[0](tiny_qwen_path, fsdp_config=_fsdp_config(variant, optimizer_offload=True,
                                                                  mixed_precision="bf16"))
        cfg["ref"]["fsdp_config"] = _fsdp_config(variant)
        return cfg

    expected = _actor_run(config("resident"), batch_factory, tmp_path / "resident", None)
    got = _actor_run(config("offload_policy"), batch_factory, tmp_path / "policy", None)
    for modules, policy in ((got["modules"], CPUOffloadPolicy), (expected["modules"], OffloadPolicy)):
        for module in modules:  # the actor, the reference
            sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]  # the root and each layer
            assert len(sharded) > 1
            assert {type(m._get_fsdp_state()._fsdp_param_group.offload_policy) for m in sharded} == {policy}
    _assert_same_training(got, expected, exact=not torch.cuda.is_available())


def test_critic_trains_the_same_with_param_offload(tiny_qwen_path, configs, batch_factory, tmp_path, monkeypatch):
    def run(variant: str, tracker: ResidencyTracker | None) -> dict:
        torch.manual_seed(0)  # the value head starts random
        cfg = configs[1](tiny_qwen_path)
        cfg["model"]["fsdp_config"] = _fsdp_config(variant, optimizer_offload=True)
        worker = CriticWorker(cfg)
        worker.init_model()
        if tracker is not None:
            tracker.watch(worker.critic_module, "critic")
        data = batch_factory(num_rows=6, seed=5)
        data.batch["values"] = worker.compute_values(data).batch["values"]
        data.batch["returns"] = torch.linspace(-1, 1, 48).view(6, 8) * data.batch["response_mask"]
        out = {"values": data.batch["values"], "losses": []}
        worker.save_checkpoint(str(tmp_path / variant), global_step=0)
        for _ in range(2):
            out["losses"].append(worker.update_critic(data).meta_info["metrics"]["critic/vf_loss"])
        out["trained"] = worker.compute_values(data).batch["values"]
        worker.load_checkpoint(str(tmp_path / variant))
        out["reloaded"] = worker.compute_values(data).batch["values"]
        if tracker is not None:
            tracker.assert_clean()
        return out

    expected = run("resident", None)
    got = run("param_offload", ResidencyTracker(monkeypatch))
    assert got["losses"] == expected["losses"]
    for key in ("values", "trained", "reloaded"):
        assert torch.equal(got[key], expected[key]), key
    assert torch.equal(got["reloaded"], got["values"])


def test_the_engine_gets_its_weights_for_the_push_and_its_kv_cache_once_the_actor_left(
        tiny_qwen_path, configs, batch_factory, monkeypatch):
    """veRL's order around the weight push with ``param_offload``: the engine's memory is released before
    the actor comes in, its weights come back for the push while the actor is resident, and its KV cache
    only after the actor has gone back to the host (the two never share the GPU)."""
    tracker = ResidencyTracker(monkeypatch)
    cfg = configs[0](tiny_qwen_path, fsdp_config=_fsdp_config("param_offload", optimizer_offload=True))
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout")
    worker.init_model()
    tracker.watch(worker.actor_module, "actor")
    engine, actor, events = worker.rollout_engine, id(worker.actor_module), []

    def spy(name, method):
        def call(*args, **kwargs):
            events.append((name, kwargs.get("weights_only", False), actor in tracker.resident))
            return method(*args, **kwargs)
        return call

    monkeypatch.setattr(engine, "release_memory", spy("release", engine.release_memory))
    monkeypatch.setattr(engine, "resume_memory", spy("resume", engine.resume_memory))
    monkeypatch.setattr(worker, "_sync_rollout_weights", spy("push", worker._sync_rollout_weights))
    data = batch_factory(num_rows=6, seed=3)
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    data.batch["ref_log_probs"] = data.batch["old_log_probs"]
    metrics = worker.update_actor(data).meta_info["metrics"]
    tracker.assert_clean()
    # (call, weights only, actor resident)
    assert events == [("release", False, False), ("resume", True, True), ("push", False, True),
                      ("resume", False, False)]
    assert {"timing_s/weight_sync", "timing_s/rollout_wait", "timing_s/release_memory"} <= metrics.keys()


class _Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class _TiedModel(torch.nn.Module):
    """Embedding and head share one weight (as tied LMs do), odd sizes (every slot needs alignment),
    and a non-persistent buffer (as rotary embeddings keep)."""

    _no_split_modules = ["_Block"]

    def __init__(self, vocab: int = 13, width: int = 7):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(_Block(width) for _ in range(2))
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * self.scale
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _locals(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from verl.utils.host_buffer import local_shard

    out = {name: local_shard(p) for name, p in model.named_parameters()}
    out.update({f"{name}.grad": local_shard(p.grad) for name, p in model.named_parameters() if p.grad is not None})
    out.update({f"buffer:{name}": b for name, b in model.named_buffers()})
    return out


def test_an_offloaded_module_lives_in_one_host_buffer_kept_from_move_to_move():
    """Each parameter (the tied one once), gradient and buffer in its slot of one exact-size buffer
    (page-locked on a GPU); the same buffer after every move back; values bit-equal through the
    moves; a gradient that appears or goes changes the layout and so the buffer. Without a GPU
    the move out is a fresh copy of every tensor on the host, so the copy into the home is real."""
    from verl.utils.host_buffer import ALIGN_BYTES

    torch.manual_seed(0)
    model = fsdp_utils.apply_fsdp2(_TiedModel(), mixed_precision="fp32")
    device = fsdp_utils.accelerator()

    def move_out():  # to the GPU, or to new host storage standing in for one
        if device is not None:
            fsdp_utils.load_model(model, device)
        else:
            model._apply(lambda t: t.clone())

    fsdp_utils.offload_model(model)
    home = fsdp_utils._HOST_HOMES[model]
    buffer = home.tensor
    tensors = _locals(model)
    assert len(tensors) == 1 + 2 * 2 + 1  # embed (= head), 2 blocks' weight and bias, the buffer
    assert buffer.numel() == sum(-(-t.numel() * t.itemsize // ALIGN_BYTES) * ALIGN_BYTES for t in tensors.values())
    assert all(home.holds(t) for t in tensors.values())
    assert model.head.weight is model.embed.weight
    if device is not None:
        assert home.page_locked and all(t.is_pinned() for t in tensors.values())

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        move_out()
        assert not any(home.holds(t) for t in _locals(model).values())
        ids = torch.arange(step, step + 6).remainder(13).view(2, 3)
        model(ids.to(device or "cpu")).square().mean().backward()
        fsdp_utils.offload_model(model)  # with the gradients: another layout
        with_grads = home.tensor
        assert with_grads is not buffer and all(home.holds(t) for t in _locals(model).values())
        move_out()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        expected = {name: t.detach().cpu().clone() for name, t in _locals(model).items()}
        fsdp_utils.offload_model(model)
        buffer = home.tensor
        now = _locals(model)
        assert now.keys() == expected.keys() and all(home.holds(t) for t in now.values())
        for name, tensor in now.items():
            assert torch.equal(tensor, expected[name]), name
        assert model.head.weight is model.embed.weight
    fsdp_utils.offload_model(model)  # already home: nothing moves
    assert home.tensor is buffer
