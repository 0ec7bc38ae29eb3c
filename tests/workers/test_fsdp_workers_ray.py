"""Two Ray worker processes with FSDP2 over gloo give the single-process result."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from verl.single_controller import RayClassWithInitArgs, RayWorkerGroup
from verl.workers.fsdp_workers import ActorRolloutRefWorker

pytestmark = pytest.mark.slow


def test_two_ranks_match_single_process(ray_cpu_pool, tiny_qwen_path, configs, batch_factory, tmp_path):
    config = configs[0](tiny_qwen_path, use_kl_loss=False)
    data = batch_factory(num_rows=6, seed=11)

    single = ActorRolloutRefWorker(config, role="actor")
    single.init_model()
    single_log_probs = single.compute_log_prob(data).batch["old_log_probs"]
    data.batch["old_log_probs"] = single_log_probs + 0.05 * torch.randn_like(single_log_probs)
    single_metrics = single.update_actor(data).meta_info["metrics"]
    single.export_hf(str(tmp_path / "single"))

    group = RayWorkerGroup(ray_cpu_pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=config, role="actor"),
                           name_prefix="fsdp_actor", timeout_s=300)
    try:
        assert group.world_size == 2
        group.init_model()
        group_log_probs = group.compute_log_prob(data).batch["old_log_probs"]
        torch.testing.assert_close(group_log_probs, single_log_probs, atol=1e-5, rtol=0)
        group_metrics = group.update_actor(data).meta_info["metrics"]
        group.export_hf(str(tmp_path / "group"))
        group.save_checkpoint(str(tmp_path / "ckpt_2_ranks"), global_step=1)
    finally:
        group.shutdown()

    assert group_metrics["actor/pg_loss"] == pytest.approx(single_metrics["actor/pg_loss"], abs=1e-5)
    assert group_metrics["actor/grad_norm"] == pytest.approx(single_metrics["actor/grad_norm"], rel=1e-4)
    expected = load_file(str(tmp_path / "single" / "model.safetensors"))
    got = load_file(str(tmp_path / "group" / "model.safetensors"))
    assert expected.keys() == got.keys()
    initial = load_file(f"{tiny_qwen_path}/model.safetensors")
    changed = max((expected[k] - initial[k]).abs().max().item() for k in expected if k in initial)
    assert changed > 1e-4, "the update did not move the weights; the comparison would be vacuous"
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)

    # a checkpoint written by 2 ranks loads into 1 rank (DCP reshards model and optimizer)
    single.load_checkpoint(str(tmp_path / "ckpt_2_ranks"))
    single.export_hf(str(tmp_path / "resharded"))
    resharded = load_file(str(tmp_path / "resharded" / "model.safetensors"))
    for name in got:
        torch.testing.assert_close(resharded[name], got[name], atol=0, rtol=0, msg=name)
