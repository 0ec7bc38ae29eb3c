"""How an entry point ends on SIGINT/SIGTERM (verl.trainer.run_exit, verl.utils.signals), with real
signals in real processes: one line, the shell's status, the clean-up run to its end once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A stand-in for an entry point: work that waits, a clean-up that takes a while (a second signal
# arrives during it), then a marker file written by the clean-up's last line.
ENTRY = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from verl.trainer.run_exit import run_or_exit

    marker = Path(sys.argv[1])

    def work():
        try:
            marker.with_suffix(".started").write_text("1")
            time.sleep(120)
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C during the clean-up
            time.sleep(0.5)
            marker.write_text("cleaned")

    run_or_exit(work, stopped=lambda: ": cleaned up")
""")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO))


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def test_a_signal_ends_the_run_in_one_line_after_its_clean_up(tmp_path):
    for signum in (signal.SIGINT, signal.SIGTERM):
        marker = tmp_path / f"{signum}.done"
        proc = subprocess.Popen([sys.executable, "-c", ENTRY, str(marker)], env=_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_for(marker.with_suffix(".started"), proc)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
        name = signal.Signals(signum).name
        assert proc.returncode == 128 + signum
        assert stderr.splitlines() == [f"stopped by {name}: cleaned up"] and stdout == ""
        assert marker.read_text() == "cleaned"  # the second signal did not cut the clean-up short


def test_a_wrapper_passes_the_signal_on_and_exits_with_the_childs_status(tmp_path):
    marker = tmp_path / "child.done"
    wrapper = textwrap.dedent(f"""
        import sys
        from verl.trainer.run_exit import run_or_exit
        from verl.utils.signals import run_child

        sys.exit(run_or_exit(lambda: run_child([sys.executable, "-c", {ENTRY!r}, {str(marker)!r}])))
    """)
    proc = subprocess.Popen([sys.executable, "-c", wrapper], env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(marker.with_suffix(".started"), proc)
    proc.send_signal(signal.SIGTERM)  # to the wrapper only, as `kill` does
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert stderr.splitlines() == ["stopped by SIGTERM: cleaned up"]  # the child's line; the wrapper adds none
    assert marker.read_text() == "cleaned"
