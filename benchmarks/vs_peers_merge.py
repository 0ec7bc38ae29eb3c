"""Merge the JSONs of several device holds of benchmarks/vs_peers_gpu.py into one report, each ratio from
ONE hold, where ours and that peer ran back to back on the same machine.

    python benchmarks/vs_peers_merge.py benchmarks/results/vs_peers_gpu_2026-12-04_hold3.json ... \
        --out benchmarks/results/vs_peers_gpu.json

A configuration whose three runs do not fit one hold (``qwen1.5b``: ~13 minutes for ours alone) is run as
ours + veRL in one hold and ours + TRL in another. For each configuration and peer the LAST hold on the
command line where both ran enough measured steps (``enough_steps``) gives ``ratio_step_vs_<peer>``,
``ratio_memory_vs_<peer>`` and ``ratio_generated_vs_<peer>`` (the tokens the two steps generated); ``pairs``
names that hold's file and card (``gpu``) with the two runs' summaries (their per-step records, commands and
log tails stay in the hold's own JSON); ``variants`` keeps the holds' variants of ours (``--ours_variant``),
each compared within its own hold; ``holds`` lists each input's file and meta.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_peers_gpu import PEERS, RATIOS, ratio_block, variant_ratios  # noqa: E402

# what a pair's run summary leaves out: bulky, and kept in the hold's own JSON
DETAIL = ("command", "log_tail", "steps", "v1_attempt", "out_of_memory_attempt")


def load_hold(path: Path) -> dict:
    """One hold's JSON. Raises ValueError naming the file when it is not a vs_peers_gpu.py report."""
    try:
        hold = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not readable as JSON ({err})") from err
    if not isinstance(hold, dict) or not isinstance(hold.get("results"), dict) or "meta" not in hold:
        raise ValueError(f"{path}: no 'meta' and 'results' (not a benchmarks/vs_peers_gpu.py report)")
    return hold


def paired(hold: dict, name: str, peer: str) -> dict | None:
    """``{name: {"ours": ..., peer: ...}}`` when both ran enough measured steps in this hold, else None."""
    systems = hold["results"].get(name, {})
    runs = {system: systems.get(system, {}) for system in ("ours", peer)}
    if all(run.get("enough_steps") for run in runs.values()):
        return {name: runs}
    return None


def merge(holds: list[tuple[str, dict]]) -> dict:
    """The merged report: per peer and configuration the ratios of the last hold that paired them."""
    report = {f"ratio_{kind}_vs_{peer}": {} for kind in RATIOS for peer in PEERS}
    pairs: dict[str, dict[str, dict]] = {peer: {} for peer in PEERS}
    absent: dict[str, dict] = {}
    for label, hold in holds:
        absent.update(hold.get("ratio_absent", {}))
        for name in hold["results"]:
            for peer in PEERS:
                both = paired(hold, name, peer)
                if both is None:
                    continue
                for key, by_config in ratio_block(both, (peer,)).items():
                    report[key].update(by_config)
                card = (hold["meta"].get("gpu") or {}).get("name")  # meta.gpu is null on a CPU machine
                pairs[peer][name] = {"hold": label, "gpu": card,
                                     **{system: {k: v for k, v in run.items() if k not in DETAIL}
                                        for system, run in both[name].items()}}
    goal = next((hold["goal"] for _, hold in reversed(holds) if "goal" in hold), None)
    return {**report, "ratio_absent": absent, "goal": goal, "pairs": pairs, "variants": merged_variants(holds),
            "holds": [{"file": label, "meta": hold["meta"]} for label, hold in holds]}


def merged_variants(holds: list[tuple[str, dict]]) -> dict:
    """Each hold's variants of ours (``--ours_variant``: ours with added overrides against ours and the
    peers of that hold, :func:`vs_peers_gpu.variant_ratios` of its results), by variant and configuration,
    the last hold that measured it winning, with its file as ``hold``."""
    out: dict = {}
    for label, hold in holds:
        for variant, by_config in variant_ratios(hold["results"]).items():
            for name, entry in by_config.items():
                out.setdefault(variant, {})[name] = {"hold": label, **entry}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("holds", nargs="+", type=Path, help="vs_peers_gpu.py JSONs, oldest first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        holds = [(path.name, load_hold(path)) for path in args.holds]
    except ValueError as err:
        parser.error(str(err))
    command = " ".join(["python benchmarks/vs_peers_merge.py", *(sys.argv[1:] if argv is None else argv)])
    merged = {"command": command, **merge(holds)}
    args.out.write_text(json.dumps(merged, indent=1) + "\n")
    print(json.dumps({k: v for k, v in merged.items() if k.startswith("ratio_")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
