"""Two FSDP2 ranks over gloo compute the unsharded model's gradients and optimizer step.

Each rank holds half of the rows and a shard of every parameter; the reference is the same model,
not sharded, on all rows in this process. Gradients (as the optimizer sees them, after the
grad-norm clip) and the parameters after one AdamW step must agree within fp32 rounding, for the
PPO critic (value loss) and for the actor (clipped policy loss + entropy + KL loss + truncated IS).
The ranks also record the warnings they saw: FSDP2 warns when a wrapped module returns a view
tensor, which it cannot protect from in-place ops (the critic's value head used to).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow

WORLD = 2
NUM_ROWS = 8  # 4 per rank, in micro-batches of 2; the unsharded reference takes all 8 at once


class GradRecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps a full (unsharded) copy of every gradient it steps on.

    Under FSDP2 the copy is an all-gather, so every rank must step (they all do: the step is
    collective already through the grad-norm reduction).
    """

    def __init__(self, model: torch.nn.Module, **kwargs):
        super().__init__(model.parameters(), **kwargs)
        self.model, self.grads = model, {}

    def step(self, closure=None):
        self.grads = {name: _full(p.grad) for name, p in self.model.named_parameters()}
        return super().step(closure)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def _config(role: str, model_path: str, micro_rows: int):
    """The typed ``critic`` / ``actor`` config: global mini-batch of all rows, ``micro_rows`` per rank."""
    from verl.utils.config import to_typed
    from verl.workers.actor.config import ActorConfig
    from verl.workers.critic.config import CriticConfig

    common = dict(ppo_mini_batch_size=NUM_ROWS, ppo_micro_batch_size_per_gpu=micro_rows, use_dynamic_bsz=False,
                  ppo_epochs=1, shuffle=False, grad_clip=1.0, loss_agg_mode="token-mean", use_torch_compile=True)
    if role == "critic":
        model = {"path": model_path, "tokenizer_path": model_path, "external_lib": None, "max_packed_row_len": 0,
                 "attn_implementation": None, "use_remove_padding": True}  # standalone: no actor to default to
        return to_typed(CriticConfig, dict(common, forward_micro_batch_size_per_gpu=micro_rows, cliprange_value=0.2,
                                           ppo_max_token_len_per_gpu=64, model=model), "critic")
    return to_typed(ActorConfig, dict(common, clip_ratio=0.2, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.01,
                                      kl_loss_type="low_var_kl", tis_imp_ratio_cap=2.0,
                                      policy_loss={"loss_mode": "vanilla"}), "actor")


def _load(role: str, model_path: str, init_path: str):
    from verl.utils.fsdp_utils import load_causal_lm, load_value_model

    model = load_value_model({"path": model_path}) if role == "critic" else load_causal_lm({"path": model_path})
    model.load_state_dict(torch.load(init_path))
    return model


def _worker(role: str, model, optimizer, model_path: str, micro_rows: int, world_size: int):
    """The data-parallel critic / actor of one rank, batched as the FSDP workers batch it."""
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.batching import actor_update_batching, critic_batching
    from verl.workers.critic.dp_critic import DataParallelPPOCritic
    from verl.workers.forward import ForwardLayout

    config, layout = _config(role, model_path, micro_rows), ForwardLayout(use_remove_padding=True)
    if role == "critic":
        update, forward = critic_batching(config, rollout_n=1, world_size=world_size)
        return DataParallelPPOCritic(config, model, optimizer, layout=layout, update=update, forward=forward)
    return DataParallelPPOActor(config, model, optimizer, layout=layout,
                                update=actor_update_batching(config, rollout_n=1, world_size=world_size))


def _run(role: str, model, data, model_path: str, micro_rows: int, world_size: int) -> dict:
    """One update of ``role`` on ``data``; the gradients stepped on, the parameters after it, and
    the forward outputs (values / log-probs) before it."""
    optimizer = GradRecordingAdamW(model, lr=1e-3, eps=1e-3, weight_decay=0.01)
    worker = _worker(role, model, optimizer, model_path, micro_rows, world_size)
    if role == "critic":
        forward = worker.compute_values(data)
        metrics = worker.update_critic(data)
    else:
        forward, _ = worker.compute_log_prob(data, worker.update.micro, 1.0)
        metrics = worker.update_policy(data, 1.0)
    params = {name: _full(p) for name, p in model.named_parameters()}
    return {"forward": forward, "grads": optimizer.grads, "params": params, "metrics": metrics}


def _rank_main(rank: int, role: str, port: int, model_path: str, init_path: str, data_path: str, out_dir: str):
    """One FSDP2 rank: its half of the rows, a shard of the model; writes what it computed."""
    from verl.utils.fsdp_utils import apply_fsdp2

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    data = torch.load(data_path, weights_only=False)
    rows = NUM_ROWS // WORLD
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = apply_fsdp2(_load(role, model_path, init_path))
        result = _run(role, model, data[rank * rows:(rank + 1) * rows], model_path, micro_rows=2, world_size=WORLD)
    result["warnings"] = [str(w.message) for w in caught]
    torch.save(result, os.path.join(out_dir, f"{role}_rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def _batch(role: str, model, model_path: str, batch_factory):
    """A PPO batch with the fields ``role`` updates on; old/ref/rollout log-probs and values
    perturbed so that the clipped branches of the losses are taken."""
    data = batch_factory(num_rows=NUM_ROWS, seed=13)
    gen = torch.Generator().manual_seed(3)
    mask = data.batch["response_mask"].float()
    worker = _worker(role, model, None, model_path, NUM_ROWS, 1)
    if role == "critic":
        values = worker.compute_values(data)
        data.batch["values"] = values + 0.3 * torch.randn(values.shape, generator=gen) * mask
        data.batch["returns"] = torch.randn(values.shape, generator=gen) * mask
    else:
        old, _ = worker.compute_log_prob(data, worker.update.micro, 1.0)
        data.batch["old_log_probs"] = old + 0.3 * torch.randn(old.shape, generator=gen) * mask
        data.batch["ref_log_probs"] = old + 0.1 * torch.randn(old.shape, generator=gen)
        data.batch["rollout_log_probs"] = old + 0.2 * torch.randn(old.shape, generator=gen)
    return data


@pytest.mark.parametrize("role", ["critic", "actor"])
def test_two_fsdp2_ranks_equal_the_unsharded_model(role, tiny_qwen_path, batch_factory, tmp_path):
    from verl.utils.fsdp_utils import _free_port

    torch.manual_seed(0)  # the critic's value head starts random: every rank loads this one init
    reference_model = _load(role, tiny_qwen_path, _save_init(role, tiny_qwen_path, tmp_path))
    data = _batch(role, reference_model, tiny_qwen_path, batch_factory)
    torch.save(data, tmp_path / "data.pt")
    initial = {name: p.detach().clone() for name, p in reference_model.named_parameters()}
    expected = _run(role, reference_model, data, tiny_qwen_path, micro_rows=NUM_ROWS, world_size=1)

    mp.spawn(_rank_main, args=(role, _free_port(), tiny_qwen_path, str(tmp_path / "init.pt"),
                               str(tmp_path / "data.pt"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"{role}_rank{r}.pt", weights_only=False) for r in range(WORLD)]

    for rank in ranks:
        views = [w for w in rank["warnings"] if "returned a view tensor" in w]
        assert not views, views[0]
    torch.testing.assert_close(torch.cat([r["forward"] for r in ranks]), expected["forward"], atol=1e-5, rtol=0)
    grads = ranks[0]["grads"]
    assert grads.keys() == expected["grads"].keys()
    assert max(g.abs().max().item() for g in expected["grads"].values()) > 1e-4, "no gradient: a vacuous check"
    for name, ref in expected["grads"].items():
        torch.testing.assert_close(grads[name], ref, atol=1e-6 + 1e-5 * float(ref.abs().max()), rtol=1e-4,
                                   msg=name)
        torch.testing.assert_close(ranks[1]["grads"][name], grads[name], atol=0, rtol=0, msg=name)
    moved = max((expected["params"][n] - initial[n]).abs().max().item() for n in initial)
    assert moved > 1e-4, "the step did not move the weights: a vacuous check"
    for name, ref in expected["params"].items():
        torch.testing.assert_close(ranks[0]["params"][name], ref, atol=1e-6, rtol=1e-5, msg=name)
    grad_norm = "critic/grad_norm" if role == "critic" else "actor/grad_norm"
    assert ranks[0]["metrics"][grad_norm] == pytest.approx(expected["metrics"][grad_norm], rel=1e-5)


def _save_init(role: str, model_path: str, tmp_path) -> str:
    """The initial weights every process loads (for the critic, a randomly drawn value head, so that
    the first step's gradient reaches the body)."""
    from verl.utils.fsdp_utils import load_causal_lm, load_value_model

    model = (load_value_model({"path": model_path}, head_init="random") if role == "critic"
             else load_causal_lm({"path": model_path}))
    path = str(tmp_path / "init.pt")
    torch.save(model.state_dict(), path)
    return path


def test_value_head_output_owns_its_storage(tiny_qwen_path):
    """The critic's head returns a fresh tensor (not a view of a flattened matmul), with the
    ``nn.Linear`` result and the checkpoint's state-dict keys."""
    from verl.utils.fsdp_utils import ValueHead, load_value_model

    torch.manual_seed(0)
    critic = load_value_model({"path": tiny_qwen_path}, head_init="random")
    head = critic.score
    assert isinstance(head, ValueHead) and {"score.weight", "score.bias"} <= critic.state_dict().keys()
    hidden = torch.randn(2, 5, head.in_features)
    out = head(hidden)
    assert out._base is None
    torch.testing.assert_close(out, torch.nn.functional.linear(hidden, head.weight, head.bias), atol=1e-6, rtol=1e-6)
    logits = critic(input_ids=torch.randint(10, 1000, (2, 7))).logits
    assert logits.shape == (2, 7, 1) and logits._base is None
    no_bias = ValueHead(4, 1, bias=False)
    assert no_bias(torch.randn(2, 3, 4))._base is None
