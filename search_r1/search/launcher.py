"""Start the retrieval server as a subprocess and wait until ``/health`` says it is ready.

Used by tests, benchmarks and the quickstart: a real server process on 127.0.0.1 with a free port,
stopped (SIGTERM, then SIGKILL) when the context exits. Its output goes to the log file the caller
names (kept, e.g. beside a run's outputs) or else to a temporary file that :meth:`ServerProcess.stop`
removes, unless the server had died by itself (then the file is kept and its path is in the error).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A running ``retrieval_server`` subprocess.

    Attributes:
        url: base URL, e.g. ``http://127.0.0.1:41234`` (POST ``url + "/retrieve"``).
        process: the ``subprocess.Popen``.
        log_path: the file holding the server's stdout and stderr.
        keep_log: False: ``log_path`` is a temporary file, removed by :meth:`stop` after a clean run.
    """

    def __init__(self, process: subprocess.Popen, url: str, log_path: str, keep_log: bool = True):
        self.process, self.url, self.log_path, self.keep_log = process, url, log_path, keep_log

    @property
    def retrieve_url(self) -> str:
        return self.url + "/retrieve"

    def log_tail(self, num_chars: int = 3000) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()[-num_chars:]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server; remove a temporary log unless the server had died by itself."""
        died = self.process.poll() not in (None, 0)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self.keep_log and not died:
            Path(self.log_path).unlink(missing_ok=True)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch_server(server_args: list[str], host: str = "127.0.0.1", port: int | None = None,
                  startup_timeout: float = 300.0, env: dict | None = None,
                  command: list[str] | None = None,
                  log_path: str | os.PathLike | None = None) -> ServerProcess:
    """Run ``python -m search_r1.search.retrieval_server <server_args> --host --port``.

    Args:
        server_args: CLI arguments except host/port (e.g. ``["--index_path", p, ...]``).
        startup_timeout: seconds to wait for ``/health`` (loading a large corpus takes a while).
        env: variables added to the child's environment.
        command: what to run instead of ``python -m search_r1.search.retrieval_server`` (e.g.
            ``[sys.executable, "search_r1/search/retriever_server.py"]`` or a launch script).
        log_path: file for the server's output (appended to, kept; its folder is created). None: a
            temporary ``retrieval_server_*.log``, removed when the server is stopped after a clean run.
    Returns:
        the ready server.
    Raises:
        RuntimeError: the process exited or did not become ready; the message holds its log tail
            and the log's path.
    """
    port = port or free_port(host)
    if log_path is None:
        log = tempfile.NamedTemporaryFile("w", prefix="retrieval_server_", suffix=".log", delete=False)
    else:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a")
    entry = command or [sys.executable, "-m", "search_r1.search.retrieval_server"]
    cmd = [*entry, *server_args, "--host", host, "--port", str(port)]
    child_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    with log:  # the child holds its own descriptor
        # its own session: a Ctrl-C in the terminal reaches the caller, which stops its users of the
        # server first and then the server (ServerProcess.stop), not all of them at once
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    server = ServerProcess(process, f"http://{host}:{port}", log.name, keep_log=log_path is not None)
    try:
        _wait_ready(server, startup_timeout)
    except BaseException:
        server.keep_log = True  # the error names the log
        server.stop()
        raise
    return server


def _wait_ready(server: ServerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"retrieval server exited with {server.process.returncode} (log: {server.log_path}):\n"
                               f"{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=2.0).json().get("ready"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"retrieval server not ready after {timeout:.0f} s (log: {server.log_path}):\n"
                       f"{server.log_tail()}")
