"""RLHFDataset with real tokenizers: chat template, left padding, position ids, overlong prompts."""

import json
import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.dataset.config import DataConfig
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

EXAMPLE_QA = Path(__file__).resolve().parents[2] / "example" / "qa"


def check_item(item, tokenizer, length):
    ids = item["raw_prompt_ids"]
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    num_pad = length - len(ids)
    assert item["input_ids"].shape == (length,)
    assert item["input_ids"][num_pad:].tolist() == ids
    assert item["input_ids"][:num_pad].tolist() == [tokenizer.pad_token_id] * num_pad
    assert item["attention_mask"].tolist() == [0] * num_pad + [1] * len(ids)
    assert item["position_ids"].tolist() == [0] * num_pad + list(range(len(ids)))


@pytest.mark.parametrize("tokenizer_name", ["qwen_tokenizer", "smollm2_tokenizer"])
def test_left_padding_and_chat_template(processed_example, tokenizer_name, request):
    tokenizer = request.getfixturevalue(tokenizer_name)
    dataset = RLHFDataset(processed_example / "test.parquet", tokenizer,
                          DataConfig(max_start_length=400, return_raw_chat=True))
    assert len(dataset) == 210 and dataset.num_filtered == 0
    item = dataset[0]
    check_item(item, tokenizer, 400)
    text = tokenizer.decode(item["raw_prompt_ids"])
    expected = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True,
                                             tokenize=False)
    assert text == expected and text.endswith("<|im_start|>assistant\n")
    assert item["data_source"] == "nq" and item["uid"] == "nq-test-0" and item["index"] == 0
    assert item["reward_model"]["ground_truth"]["target"]


def test_pad_equal_to_eos_is_still_attended(processed_example, smollm2_tokenizer):
    """SmolLM2: pad == eos == <|im_end|>, which also ends the user turn inside every prompt."""
    tokenizer = smollm2_tokenizer
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    item = RLHFDataset(processed_example / "train.parquet", tokenizer, DataConfig(max_start_length=400))[0]
    ids = item["input_ids"][item["attention_mask"].bool()]
    assert (ids == tokenizer.pad_token_id).sum() >= 1     # the real <|im_end|> is attended
    assert int(item["attention_mask"].sum()) == len(item["raw_prompt_ids"])


def test_raw_text_without_chat_template(processed_example, qwen_tokenizer):
    import copy

    tokenizer = copy.deepcopy(qwen_tokenizer)
    tokenizer.chat_template = None
    dataset = RLHFDataset([processed_example / "test.parquet"], tokenizer, DataConfig(max_start_length=300))
    text = tokenizer.decode(dataset[0]["raw_prompt_ids"])
    assert text.startswith("Answer the given question.") and text.endswith("?\n")


def test_collate_to_dataproto(processed_example, qwen_tokenizer):
    dataset = RLHFDataset(processed_example / "train.parquet", qwen_tokenizer, DataConfig(max_start_length=300))
    batch = collate_fn([dataset[i] for i in (0, 1, 400)])
    assert batch["input_ids"].shape == (3, 300) and batch["input_ids"].dtype == torch.long
    assert batch["raw_prompt_ids"].dtype == object and batch["raw_prompt_ids"].shape == (3,)
    assert isinstance(batch["raw_prompt_ids"][0], list)
    assert list(batch["data_source"]) == ["nq", "nq", "hotpotqa"]
    data = DataProto.from_single_dict(batch)
    assert len(data) == 3 and set(data.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
    assert len(set(data.non_tensor_batch["uid"])) == 3


def write_rows(path, questions):
    rows = [{"data_source": "nq", "prompt": [{"role": "user", "content": q}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
             "extra_info": {"split": "train", "index": i, "uid": f"nq-train-{i}"}}
            for i, q in enumerate(questions)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_overlong_prompts_filtered_with_log(tmp_path, qwen_tokenizer, caplog):
    path = tmp_path / "d.parquet"
    write_rows(path, ["short question?", "long " * 200, "another short one?", "long " * 300])
    with caplog.at_level(logging.WARNING):
        dataset = RLHFDataset(path, qwen_tokenizer, DataConfig(max_start_length=64))
    assert len(dataset) == 2 and dataset.num_filtered == 2
    assert [dataset[i]["uid"] for i in range(2)] == ["nq-train-0", "nq-train-2"]
    assert "filtered 2 of 4" in caplog.text and "nq-train-1" in caplog.text


def test_overlong_prompt_raises_when_filter_off(tmp_path, qwen_tokenizer):
    path = tmp_path / "d.parquet"
    write_rows(path, ["short question?", "long " * 200])
    with pytest.raises(ValueError, match=r"row 1 \(uid nq-train-1\).*max_start_length=64"):
        RLHFDataset(path, qwen_tokenizer, DataConfig(filter_overlong_prompts=False, max_start_length=64))


def test_missing_file_and_column(tmp_path, qwen_tokenizer):
    with pytest.raises(FileNotFoundError, match="nothere.parquet"):
        RLHFDataset(tmp_path / "nothere.parquet", qwen_tokenizer)
    path = tmp_path / "d.parquet"
    write_rows(path, ["q?"])
    with pytest.raises(ValueError, match=r"d.parquet: no column 'question'"):
        RLHFDataset(path, qwen_tokenizer, DataConfig(prompt_key="question"))


def test_pad_token_set_when_missing(tmp_path, smollm2_tokenizer):
    import copy

    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.pad_token = None
    path = tmp_path / "d.parquet"
    write_rows(path, ["q?"])
    item = RLHFDataset(path, tokenizer, DataConfig(max_start_length=128))[0]
    assert tokenizer.pad_token == tokenizer.eos_token
    assert int(item["attention_mask"].sum()) == len(item["raw_prompt_ids"])
    assert np.all(item["input_ids"][:10].numpy() == tokenizer.eos_token_id)


def test_typed_data_section(tmp_path, qwen_tokenizer):
    from verl.utils.config import to_typed

    path = tmp_path / "d.parquet"
    write_rows(path, ["short question?", "long " * 200])
    data = to_typed(DataConfig, {"prompt_key": "prompt", "max_start_length": 64,
                                 "filter_overlong_prompts": True, "return_raw_chat": True}, prefix="data")
    dataset = RLHFDataset(str(path), qwen_tokenizer, data)
    assert len(dataset) == 1 and dataset[0]["raw_prompt"][0]["content"] == "short question?"
    assert dataset[0]["input_ids"].shape == (64,)


def search_r1_guide_row(i, question, ground_truth):
    """A row as Search-R1's "use your own dataset" guide writes it (a QA source name, which picks the
    EM reward)."""
    return {"data_source": "nq", "prompt": [{"role": "user", "content": question}],
            "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": "train", "index": i}}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_jsonl_rows_as_search_r1_guide_writes_them(tmp_path, qwen_tokenizer, processed_example):
    path = tmp_path / "custom.jsonl"
    write_jsonl(path, [search_r1_guide_row(0, "who wrote hamlet?", "William Shakespeare"),
                       "", search_r1_guide_row(1, "capital of france?", {"target": ["Paris", "paris"]}),
                       search_r1_guide_row(2, "two answers?", ["a", "b"])])
    dataset = RLHFDataset([path, processed_example / "test.parquet"], qwen_tokenizer, DataConfig(max_start_length=400))
    assert len(dataset) == 3 + 210
    first, second = dataset[0], dataset[1]
    check_item(first, qwen_tokenizer, 400)
    assert first["reward_model"] == {"style": "rule", "ground_truth": {"target": ["William Shakespeare"]}}
    assert second["reward_model"]["ground_truth"] == {"target": ["Paris", "paris"]}
    assert dataset[2]["reward_model"]["ground_truth"] == {"target": ["a", "b"]}
    assert first["uid"] == "custom-0" and second["index"] == 1 and first["data_source"] == "nq"
    batch = collate_fn([dataset[0], dataset[3]])  # JSONL and parquet rows mix in one batch
    assert batch["uid"][0] == "custom-0" and batch["uid"][1] == dataset[3]["uid"] != "custom-3"

    from search_r1.envs.search_r1 import reward
    assert reward.compute_score("nq", "<answer> william shakespeare </answer>",
                                first["reward_model"]["ground_truth"])["score"] == 1.0


@pytest.mark.parametrize("line,message", [
    ('{"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "x"', r"line 2: not valid JSON"),
    ('["not", "an", "object"]', r"line 2: a row must be a JSON object"),
    ('{"reward_model": {"ground_truth": "x"}}', r"line 2: no field 'prompt'"),
    ('{"prompt": "q?"}', r"line 2: no field 'reward_model'"),
    ('{"prompt": "q?", "reward_model": {"style": "rule"}}', r"line 2: reward_model has no 'ground_truth'"),
    ('{"prompt": "q?", "reward_model": {"ground_truth": {"answers": ["x"]}}}', r"line 2: reward_model.ground_truth is an object without 'target'"),
    ('{"prompt": "q?", "reward_model": {"ground_truth": {"target": [1, 2]}}}', r"line 2: reward_model.ground_truth.target must be a string"),
    ('{"prompt": "q?", "reward_model": {"ground_truth": []}}', r"line 2: reward_model.ground_truth must be a string"),
    ('{"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "x"}}', r"line 2: prompt must be"),
    ('{"prompt": "q?", "reward_model": {"ground_truth": "x"}, "extra_info": 3}', r"line 2: extra_info must be an object"),
])
def test_jsonl_errors_name_file_line_and_field(tmp_path, qwen_tokenizer, line, message):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [search_r1_guide_row(0, "fine question?", "x"), line])
    with pytest.raises(ValueError, match=re.escape(str(path)) + " " + message):
        RLHFDataset(path, qwen_tokenizer, DataConfig(max_start_length=128))


def test_parquet_gets_the_same_checks_and_unknown_extensions_are_named(tmp_path, qwen_tokenizer):
    path = tmp_path / "d.parquet"
    rows = [search_r1_guide_row(0, "q?", "x"), search_r1_guide_row(1, "q2?", "y")]
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": ""}
    rows[1]["reward_model"]["ground_truth"] = None
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"d.parquet row 1: reward_model.ground_truth must be a string"):
        RLHFDataset(path, qwen_tokenizer, DataConfig(max_start_length=128))
    other = tmp_path / "d.csv"
    other.write_text("prompt\nq\n")
    with pytest.raises(ValueError, match=r"d.csv: RL data must be parquet \(.parquet\) or JSONL"):
        RLHFDataset(other, qwen_tokenizer)


def test_overlong_jsonl_prompt_names_its_line(tmp_path, qwen_tokenizer):
    path = tmp_path / "long.jsonl"
    write_jsonl(path, [search_r1_guide_row(0, "short?", "x"), search_r1_guide_row(1, "long " * 200, "x")])
    with pytest.raises(ValueError, match=r"long.jsonl line 2 \(uid long-1\).*max_start_length=64"):
        RLHFDataset(path, qwen_tokenizer, DataConfig(filter_overlong_prompts=False, max_start_length=64))


def test_flashrag_rows_train_as_the_data_scripts_would_write_them(processed_example, smollm2_tokenizer, tmp_path):
    """FlashRAG QA files (``{"id", "question", "golden_answers"}``, Search-R1's data guide's start) given
    directly to the trainer's loader get the rows scripts/data_process/ write: same prompt, answers,
    data_source (FlashRAG's folder name) and uid; JSONL and parquet alike."""
    import pandas as pd

    from verl.trainer.ppo.config import default_config
    from verl.trainer.ppo.trainer_setup import build_dataset, build_environment

    cfg = default_config(data={"max_start_length": 400})
    env = build_environment(cfg, smollm2_tokenizer)
    flashrag = EXAMPLE_QA / "nq" / "train.jsonl"
    direct = build_dataset(str(flashrag), smollm2_tokenizer, cfg, None, env).dataset
    scripted = RLHFDataset(processed_example / "train.parquet", smollm2_tokenizer, DataConfig(max_start_length=400))
    scripted_nq = [i for i, row in enumerate(scripted.rows) if row["data_source"] == "nq"]
    assert len(direct) == len(scripted_nq) > 0
    for i, j in enumerate(scripted_nq):
        a, b = direct[i], scripted[j]
        assert a["raw_prompt_ids"] == b["raw_prompt_ids"] and a["uid"] == b["uid"]
        assert a["reward_model"] == b["reward_model"] and a["data_source"] == b["data_source"] == "nq"

    rows = [json.loads(line) for line in flashrag.read_text().splitlines()[:3]]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.jsonl").write_text("".join(json.dumps({k: r[k] for k in ("id", "question", "golden_answers")}) + "\n"
                                              for r in rows))
    pd.DataFrame([{k: r[k] for k in ("id", "question", "golden_answers")} for r in rows]).to_parquet(mine / "test.parquet")
    for name in ("train.jsonl", "test.parquet"):
        dataset = build_dataset(str(mine / name), smollm2_tokenizer, cfg, None, env).dataset
        assert [dataset[i]["raw_prompt_ids"] for i in range(3)] == [direct[i]["raw_prompt_ids"] for i in range(3)]
        # a folder that is no FlashRAG source name: exact match as for NQ, the split from the file name
        assert dataset[0]["data_source"] == "nq" and dataset[0]["uid"] == f"nq-{name.split('.')[0]}-0"


def test_rows_of_neither_form_name_both(smollm2_tokenizer, tmp_path):
    from search_r1.envs.search_r1 import SearchR1Environment
    from search_r1.envs.search_tool import SearchTool

    env = SearchR1Environment(smollm2_tokenizer, SearchTool(None), 500)

    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}\n{"question": "x"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path} line 2: no field 'prompt' (fields: ['question']); "
                                                   "FlashRAG rows {'question', 'golden_answers'} are read too")):
        RLHFDataset(path, smollm2_tokenizer, env=env)
    path.write_text('{"question": " ", "golden_answers": ["Shakespeare"]}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path} line 1: a FlashRAG row needs a non-empty 'question'")):
        RLHFDataset(path, smollm2_tokenizer, env=env)
