"""``compile_decoder_layers``: the decoder layers of the actor and the reference share one compiled graph
per grad mode, and new packed lengths and steps recompile nothing (dynamo's ``eager`` backend: the same
tracing and guards as the GPU's inductor, no code generation)."""

from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.utils import counters
from verl.utils.fsdp_utils import compile_decoder_layers, decoder_layers, load_causal_lm
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.batching import actor_update_batching
from verl.workers.forward import ForwardLayout

from .test_dp_actor import actor_config, log_probs_of


def _actor(model, config, optimizer=None):
    return DataParallelPPOActor(config, model, optimizer, layout=ForwardLayout(use_remove_padding=True),
                                update=actor_update_batching(config, rollout_n=1, world_size=1))


def test_layers_compile_once_per_grad_mode_across_layers_lengths_and_steps(tiny_qwen_path, batch_factory):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    actor_model = load_causal_lm({"path": tiny_qwen_path})
    ref_model = load_causal_lm({"path": tiny_qwen_path}, trainable=False)
    eager_model = load_causal_lm({"path": tiny_qwen_path}, trainable=False)
    assert len(decoder_layers(actor_model)) >= 2  # a per-layer recompile would show
    assert compile_decoder_layers(actor_model, backend="eager") == len(decoder_layers(actor_model))
    compile_decoder_layers(ref_model, backend="eager")
    # the learning step's passes: reference log-probs (no grad), then the update over token-budget micro-batches
    config = actor_config(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=160, ppo_mini_batch_size=12,
                          ppo_micro_batch_size_per_gpu=12, use_kl_loss=True)
    actor = _actor(actor_model, config, torch.optim.AdamW(actor_model.parameters(), lr=1e-4))
    ref, eager = _actor(ref_model, config), _actor(eager_model, config)

    def step(seed: int, rows: int, prompt_len: int, response_len: int) -> None:
        data = batch_factory(num_rows=rows, prompt_len=prompt_len, response_len=response_len, vocab=1000, seed=seed)
        with torch.no_grad():
            data.batch["ref_log_probs"], _ = log_probs_of(ref, data)
            # compiled, the same numbers as the uncompiled copy of the same weights
            torch.testing.assert_close(data.batch["ref_log_probs"], log_probs_of(eager, data)[0], atol=1e-5, rtol=0)
        actor.update_policy(data, 1.0)

    step(0, 12, 14, 10)
    # one graph without grad (the reference's layers) and one with (the actor's): shared by every layer
    assert counters["stats"]["unique_graphs"] == 2
    with torch.compiler.set_stance("fail_on_recompile"):  # any guard failure from here on raises
        step(1, 12, 16, 12)
        step(2, 10, 11, 9)
