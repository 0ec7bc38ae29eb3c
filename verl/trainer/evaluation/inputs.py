"""Start-up checks of an evaluation's inputs, each failing with one line that names the culprit.

The model (a checkpoint's ``huggingface/`` export, its ``global_step_N`` folder, or a hub id), the
evaluation parquet (Search-R1 rows from ``scripts/data_process/qa_search_test_merge.py``) and the
retriever are checked before any worker starts, so a typo costs seconds, not an engine start.
"""

from __future__ import annotations

import re
from pathlib import Path

REQUIRED_COLUMNS = ("data_source", "reward_model")
DATA_HINT = "make it with scripts/data_process/qa_search_test_merge.py --local_dir DIR"
STEP_FOLDER = re.compile(r"^global_step_(\d+)$")


def resolve_model(path: str) -> str:
    """The folder to load: ``path`` itself, or its ``huggingface/`` export for a checkpoint folder.

    Raises:
        ValueError: no such folder, a folder without ``config.json``, or a hub id that does not
            load here (offline, only the local Hugging Face cache serves hub ids).
    """
    local = Path(path).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return str(local)
        if (local / "huggingface" / "config.json").is_file():
            return str(local / "huggingface")
        raise ValueError(f"model folder {path} has no config.json (expected a checkpoint's "
                         f"global_step_N/huggingface export or a Hugging Face model folder)")
    if local.exists():
        raise ValueError(f"model path {path} is a file, not a model folder")
    if path.startswith(("/", "./", "../", "~")) or path.count("/") > 1:
        raise ValueError(f"model path {path} does not exist (give a checkpoint's global_step_N/huggingface "
                         f"export or a hub id such as Qwen/Qwen2.5-3B)")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"model {path!r} is no local folder and does not load as a hub id here ({reason})") from None
    return path


def checkpoint_step(model_path: str) -> int:
    """N of a ``.../global_step_N/huggingface`` path (0 for any other model)."""
    for part in reversed(Path(model_path).parts):
        match = STEP_FOLDER.match(part)
        if match:
            return int(match.group(1))
    return 0


def check_parquet(path: str, prompt_key: str = "prompt") -> None:
    """An evaluation parquet must hold Search-R1 rows: ``data_source``, the prompt and
    ``reward_model.ground_truth``.

    Raises:
        ValueError: missing file, not parquet, or a missing column / field (names them all).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"data file not found: {path} ({DATA_HINT})")
    try:
        schema = pq.read_schema(file)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{path}: not a readable parquet file ({error})") from None
    missing = [c for c in (REQUIRED_COLUMNS[0], prompt_key, *REQUIRED_COLUMNS[1:]) if c not in schema.names]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {schema.names}); "
                         f"evaluation reads Search-R1 rows ({DATA_HINT})")
    reward_type = schema.field("reward_model").type
    if not pa.types.is_struct(reward_type) or reward_type.get_field_index("ground_truth") < 0:
        raise ValueError(f"{path}: column 'reward_model' has no 'ground_truth' field (type {reward_type}; "
                         f"{DATA_HINT})")


def select_per_source(files: list[str], max_per_source: int | None, out_path: Path) -> list[str]:
    """The first ``max_per_source`` rows of each data source (file order), written to ``out_path``.

    Returns the files to evaluate: ``files`` unchanged when ``max_per_source`` is None.
    Raises:
        ValueError: ``max_per_source`` below 1.
    """
    if max_per_source is None:
        return list(files)
    if int(max_per_source) < 1:
        raise ValueError(f"evaluation.max_per_source must be >= 1, got {max_per_source}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    counts: dict[str, int] = {}
    tables = []
    for file in files:
        table = pq.read_table(Path(file).expanduser())
        keep = []
        for source in table.column("data_source").to_pylist():
            counts[source] = counts.get(source, 0) + 1
            keep.append(counts[source] <= int(max_per_source))
        tables.append(table.filter(pa.array(keep)))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(tables, promote_options="default"), out_path)
    return [str(out_path)]




def default_output_dir(model_path: str, val_files: list[str]) -> Path:
    """``<global_step_N>/evaluation/<data name>`` beside a checkpoint's export, else
    ``evaluations/<model name>/<data name>``; the data name is the evaluation file's folder."""
    first = Path(val_files[0])
    data_name = first.parent.name or first.stem
    model = Path(model_path)
    if model.name == "huggingface" and STEP_FOLDER.match(model.parent.name):
        return model.parent / "evaluation" / data_name
    return Path("evaluations") / (model.name or model_path.replace("/", "--")) / data_name
