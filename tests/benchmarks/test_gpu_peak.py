"""The whole-GPU memory peak (benchmarks/common.py's GpuMemorySampler, benchmarks/gpu_peak.py): nvidia-smi's
lines read right, each process named, the peak written as it rises and kept when the sampler is stopped.
No GPU here: a stand-in ``nvidia-smi`` on PATH answers the two queries in nvidia-smi's own CSV format."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402

GPU_PEAK = ROOT / "benchmarks" / "gpu_peak.py"


def test_the_gpu_peak_names_each_process_share():
    """nvidia-smi's compute-apps lines -> {pid: GiB}; a process is named by its command line's first word."""
    text = "1234, 40960\n  77, 1024 \n88, [N/A]\nNo running processes found\n"
    assert common.parse_compute_apps(text) == {1234: 40.0, 77: 1.0}
    child = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        # Popen returns while the kernel may still be setting up the new program (its command line
        # empty for a moment): wait until the child runs
        assert child.stdout.readline().strip() == "up"
        label = common.process_label(child.pid)
        assert label.endswith(f" ({child.pid})")
        if Path("/proc/self").resolve().name == str(os.getpid()):  # else /proc shows another PID namespace
            # the command line's first word, or where a sandbox hides it the kernel's name (<= 15 characters)
            assert label in {f"{Path(sys.executable).name} ({child.pid})",
                             f"{Path(os.path.realpath(sys.executable)).name[:15]} ({child.pid})"}
    finally:
        child.kill()
        child.communicate()
    assert common.process_label(2**22 + 12345) == f"? ({2**22 + 12345})"  # gone (or never was): still one label


def fake_nvidia_smi(folder: Path, used_mib: list[int]) -> Path:
    """An ``nvidia-smi`` answering ``--query-gpu=memory.used`` with ``used_mib`` in turn (then the last one
    again), counting those calls in ``folder/calls``, and ``--query-compute-apps`` with its caller, the
    sampler, holding 4 GiB."""
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text(f"""#!{sys.executable}
import os, sys
from pathlib import Path
state = Path({str(folder / "calls")!r})
if sys.argv[1] == "--query-gpu=memory.used":
    n = int(state.read_text()) if state.exists() else 0
    tmp = state.with_suffix(".tmp")
    tmp.write_text(str(n + 1))
    os.replace(tmp, state)  # the test polls this count: never let it read a half-written file
    print({used_mib!r}[min(n, {len(used_mib) - 1})])
else:
    print(f"{{os.getppid()}}, 4096")
""")
    script.chmod(0o755)
    return folder


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    """Poll ``predicate`` until true; a hang guard, not a speed check (60 s is far beyond any host's need)."""
    deadline = time.time() + timeout_s
    while not predicate():
        if time.time() > deadline:
            raise TimeoutError("the sampler took no samples")
        time.sleep(0.05)


def test_the_sampler_writes_its_peak_as_it_rises_and_stops_on_sigterm(tmp_path):
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [1024, 6144, 2048])
    out = tmp_path / "run" / "gpu_peak.json"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    sampler = subprocess.Popen([sys.executable, str(GPU_PEAK), "--out", str(out), "--interval_s", "0.05"], env=env)
    try:
        # three samples taken: the peak (6 GiB, the second) is on file, the fall after it changes nothing
        wait_for(lambda: (tmp_path / "bin" / "calls").exists() and int((tmp_path / "bin" / "calls").read_text()) >= 4)
        sampler.send_signal(signal.SIGTERM)
        assert sampler.wait(timeout=30) == 0
    finally:
        sampler.kill()
    record = json.loads(out.read_text())
    assert record["peak_gpu_memory_gib"] == 6.0 and record["samples"] == 2 and record["interval_s"] == 0.05
    # the stand-in names its caller, the sampler: labelled while it ran (its command line's first word)
    [(label, gib)] = record["peak_gpu_memory_by_process_gib"].items()
    assert label.endswith(f" ({sampler.pid})") and not label.startswith("?") and gib == 4.0
    assert not out.with_suffix(".tmp").exists()


def test_the_sampler_stops_when_the_watched_process_exits_and_without_nvidia_smi_records_nothing(tmp_path):
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [512])
    out = tmp_path / "gpu_peak.json"
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, str(GPU_PEAK), "--out", str(out), "--interval_s", "0.05",
                           "--pid", str(watched.pid)], env=env, timeout=60)
    watched.wait()
    assert done.returncode == 0 and json.loads(out.read_text())["peak_gpu_memory_gib"] == 0.5
    # a CPU machine: one line on stderr, no file, exit 0 (the run it sits beside goes on)
    bare = subprocess.run([sys.executable, str(GPU_PEAK), "--out", str(tmp_path / "none.json")],
                          env={**os.environ, "PATH": str(tmp_path / "empty")}, capture_output=True, text=True,
                          timeout=60)
    assert bare.returncode == 0 and "no nvidia-smi" in bare.stderr and not (tmp_path / "none.json").exists()
