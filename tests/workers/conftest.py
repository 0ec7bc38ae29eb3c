"""Fixtures for the worker tests: PPO batches shaped like the trainer's, built from real token ids."""

from __future__ import annotations

import pytest
import torch



def make_ppo_batch(num_rows: int = 6, prompt_len: int = 10, response_len: int = 8, vocab: int = 5000,
                   seed: int = 0):
    """A DataProto with left-padded prompts, right-padded responses and an observation span.

    Prompt lengths and response lengths vary per row; one row's response has an observation
    span (attention 1, response_mask 0) in the middle, as the search loop produces.
    """
    from verl.protocol import DataProto
    from verl.utils.torch_functional import position_ids_from_mask

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, vocab, (num_rows, prompt_len), generator=gen)
    responses = torch.randint(10, vocab, (num_rows, response_len), generator=gen)
    prompt_mask = torch.ones(num_rows, prompt_len, dtype=torch.long)
    response_attn = torch.ones(num_rows, response_len, dtype=torch.long)
    for row in range(num_rows):
        prompt_mask[row, : int(torch.randint(0, prompt_len // 2, (1,), generator=gen))] = 0
        keep = int(torch.randint(response_len // 2, response_len + 1, (1,), generator=gen))
        response_attn[row, keep:] = 0
    prompts = prompts * prompt_mask  # pad id 0 where masked (never used to infer masks)
    responses = responses * response_attn
    response_mask = response_attn.clone()
    response_mask[0, 1:3] = 0  # an observation span: attended to but not trained on
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
    tensors = {
        "prompts": prompts, "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "response_mask": response_mask,
        "advantages": torch.randn(num_rows, response_len, generator=gen) * response_mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


@pytest.fixture(scope="session")
def batch_factory():
    """``make_ppo_batch`` as a fixture, so test modules need no import of this file."""
    return make_ppo_batch
