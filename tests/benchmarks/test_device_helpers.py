"""The device drivers' helpers that run unchanged here: benchmarks/device/install_missing.py installs only
the wheels whose distribution is absent, and common.sh's ``run_from_snapshot`` moves a detached run into a
copy of the tree that a later call's fresh copy of the tree cannot touch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALL_MISSING = ROOT / "benchmarks" / "device" / "install_missing.py"


def write_wheel(folder: Path, dist: str, version: str) -> Path:
    """A minimal pure wheel (PEP 427): one module named after the distribution and its dist-info."""
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{dist}_probe.py", "VALUE = 1\n")
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def test_only_the_distributions_this_interpreter_lacks_are_installed(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "packaging", "0.0.1")  # installed here (pytest needs it): must be left alone
    write_wheel(wheels, "zz_search_r1_absent", "1.0")
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, str(INSTALL_MISSING), str(wheels), str(target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 of 2" in done.stdout and "zz_search_r1_absent" in done.stdout
    assert (target / "zz_search_r1_absent_probe.py").exists()
    assert not (target / "packaging_probe.py").exists()
    assert not any(p.name.startswith("packaging-") for p in target.iterdir())


def test_an_empty_wheel_folder_is_an_error_naming_it(tmp_path):
    done = subprocess.run([sys.executable, str(INSTALL_MISSING), str(tmp_path), str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert str(tmp_path) in done.stderr


def test_a_detached_run_works_in_a_snapshot_the_next_calls_copy_cannot_touch(tmp_path):
    tree, work = tmp_path / "tree", tmp_path / "work"
    (tree / "benchmarks" / "device").mkdir(parents=True)
    (tree / "benchmarks" / "device" / "common.sh").write_text((ROOT / "benchmarks/device/common.sh").read_text())
    (tree / "verl").mkdir()
    (tree / "verl" / "main_ppo.py").write_text("print('ok')\n")
    (tree / ".whl-big").mkdir()
    (tree / ".whl-big" / "vllm.part00").write_bytes(b"x" * 1024)
    script = f"work={work}; source benchmarks/device/common.sh; run_from_snapshot; pwd; echo $PYTHONPATH"
    done = subprocess.run(["bash", "-c", script], cwd=tree, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path / "out")})
    assert done.returncode == 0, done.stderr
    cwd, pythonpath = done.stdout.split()[-2:]
    assert Path(cwd) == work / "repo" and pythonpath == f"/tmp/site:{work / 'repo'}"
    assert (work / "repo" / "verl" / "main_ppo.py").exists()
    assert not (work / "repo" / ".whl-big").exists()  # the wheel parts stay where the install reads them
    # a later call's fresh copy of the tree (here: the tree's modules gone) leaves the snapshot whole
    (tree / "verl" / "main_ppo.py").unlink()
    assert (work / "repo" / "verl" / "main_ppo.py").read_text() == "print('ok')\n"


def test_the_paper_scale_driver_runs_each_shape_detached_and_the_poll_brings_the_reports_back(tmp_path):
    """benchmarks/device/paper_scale.sh's start and poll stages, with the GPU training script replaced by one
    that writes what the real one writes (its summary and paper_scale.json), from a snapshot of the tree."""
    tree, work, out = tmp_path / "tree", tmp_path / "work", tmp_path / "out"
    (tree / "benchmarks" / "device").mkdir(parents=True)
    (tree / "benchmarks" / "results").mkdir()
    for name in ("common.sh", "paper_scale.sh"):
        (tree / "benchmarks" / "device" / name).write_text((ROOT / "benchmarks" / "device" / name).read_text())
    (tree / "benchmarks" / "results" / "paper_scale.json").write_text('{"retriever": {}}\n')
    (tree / "benchmarks" / "paper_scale_train.sh").write_text(  # the stand-in: needs no GPU
        'echo "shape $SHAPE on $GPUS as [$VARIANT] [$EXTRA] from $PWD"; echo "{\\"shape\\": \\"$SHAPE\\"}" > "$OUT/paper_scale_train_$SHAPE.json"\n'
        'cat "$OUT/paper_scale.json" > /dev/null && echo "== grpo: $SHAPE"\n')
    env = {**os.environ, "WORK_DIR": str(work), "OUT": str(out), "SHAPES": "qwen2.5-3b,qwen2.5-1.5b",
           "GPU_COUNTS": "1,2"}
    driver = ["bash", "benchmarks/device/paper_scale.sh"]
    started = subprocess.run(driver, cwd=tree, env={**env, "STAGE": "start"}, capture_output=True, text=True,
                             timeout=60)
    assert started.returncode == 0 and "paper_scale started" in started.stdout, started.stderr
    polled = subprocess.run(driver, cwd=tree, env={**env, "STAGE": "poll", "WAIT_S": "30"}, capture_output=True,
                            text=True, timeout=60)
    assert polled.returncode == 0, polled.stderr
    assert "== grpo: qwen2.5-3b" in polled.stdout and "paper_scale: done" in polled.stdout
    log = (out / "run.log.txt").read_text()
    # one shape after the other, each on one GPU, then on two
    order = [log.index(f"shape {shape} on {gpus} as [] [] ") for shape in ("qwen2.5-3b", "qwen2.5-1.5b")
             for gpus in (1, 2)]
    assert order == sorted(order)
    assert f"from {work / 'repo'}" in log  # in the snapshot, not the tree the next call re-copies
    assert {p.name for p in out.glob("paper_scale*.json")} == {
        "paper_scale.json", "paper_scale_train_qwen2.5-3b.json", "paper_scale_train_qwen2.5-1.5b.json"}
    # a second start (another VARIANT) on the same machine adds to the report the first runs wrote
    (work / "results" / "paper_scale.json").write_text('{"train": {"first": {}}}\n')
    again = subprocess.run(driver, cwd=tree, env={**env, "STAGE": "start", "SHAPES": "qwen2.5-3b", "GPU_COUNTS": "1"},
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and not again.stderr, again.stderr
    subprocess.run(driver, cwd=tree, env={**env, "STAGE": "poll", "WAIT_S": "30"}, capture_output=True, timeout=60)
    assert json.loads((out / "paper_scale.json").read_text()) == {"train": {"first": {}}}
    # THEN_VARIANT: each run plain, then again with THEN_EXTRA's overrides (spaces, = and quotes kept whole)
    (work / "run.log").unlink()
    pair = subprocess.run(driver, cwd=tree, env={**env, "STAGE": "start", "SHAPES": "qwen2.5-1.5b", "GPU_COUNTS": "1",
                                                 "THEN_VARIANT": "async", "THEN_EXTRA": "a.mode=async b={K:'x:y'}"},
                          capture_output=True, text=True, timeout=60)
    assert pair.returncode == 0 and not pair.stderr, pair.stderr
    subprocess.run(driver, cwd=tree, env={**env, "STAGE": "poll", "WAIT_S": "30"}, capture_output=True, timeout=60)
    log = (out / "run.log.txt").read_text()
    plain, variant = log.index("shape qwen2.5-1.5b on 1 as [] []"), log.index(
        "shape qwen2.5-1.5b on 1 as [async] [a.mode=async b={K:'x:y'}]")
    assert plain < variant


def test_the_gpu_tests_driver_reports_pytests_outcome_and_its_junit_file(tmp_path):
    """benchmarks/device/gpu_tests.sh runs the selected tests with the device's environment and keeps pytest's
    exit status (the tail it prints would otherwise hide a failure) and its JUnit report in $OUT."""
    (tmp_path / "test_probe.py").write_text("def test_passes():\n    assert True\n\n"
                                            "def test_fails():\n    assert 1 == 2\n")
    out = tmp_path / "out"
    env = {**os.environ, "WORK_DIR": str(tmp_path / "work"), "OUT": str(out), "PYTHON": sys.executable}
    for selection, status in (("::test_passes", 0), ("", 1)):
        done = subprocess.run(["bash", "benchmarks/device/gpu_tests.sh"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env={**env, "TESTS": f"{tmp_path / 'test_probe.py'}{selection}"})
        assert done.returncode == status, done.stdout + done.stderr
        report = (out / "gpu_tests.xml").read_text()
        assert 'name="test_passes"' in report
        assert ('name="test_fails"' in report) == (status == 1)
