"""Servers the tests start: on 127.0.0.1, an ephemeral port, waited for with a deadline, and always stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

STARTUP_DEADLINE_S = 120


@contextmanager
def serving_in_thread(app: Any) -> Iterator[str]:
    """``app`` on uvicorn in a thread of this process; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rss_mb(pid: int) -> float:
    """The process's resident memory now, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextmanager
def serving_in_process(command: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``command`` (an `annotate serve` on ``port``) as its own process, until /health answers; stopped after."""
    process = subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server ended: {process.stdout.read().decode()[-2000:]}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not answer /health in time")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # uvicorn shuts down on Ctrl-C
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


LABEL_STUDIO = Path(__file__).resolve().parent.parent / ".venv-labelstudio" / "bin" / "label-studio"
LABEL_STUDIO_STARTUP_S = 600  # its first start migrates a new SQLite database: about 2.5 minutes on 2 busy cores
LABEL_STUDIO_USER, LABEL_STUDIO_PASSWORD = "reviewer@example.com", "a-long-test-password"


@dataclass(frozen=True)
class StartedLabelStudio:
    process: subprocess.Popen[bytes]
    url: str
    log: Path


@contextmanager
def label_studio_process(data_dir: Path, user: str, password: str) -> Iterator[StartedLabelStudio]:
    """A real Label Studio (scripts/install.sh puts it in its own environment) started on 127.0.0.1, with a new SQLite
    database under ``data_dir`` and its first user, not waited for (:func:`answering`); stopped at the end. No
    network: it does not look for a newer version; and it may call an ML backend on this machine (its default bans
    loopback addresses as SSRF targets)."""
    port = free_port()
    env = {
        **os.environ,
        "LATEST_VERSION_CHECK": "false",
        "USE_DEFAULT_BANNED_SUBNETS": "false",
        "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
        "LABEL_STUDIO_USERNAME": user,
        "LABEL_STUDIO_PASSWORD": password,
    }
    command = [str(LABEL_STUDIO), "start", "--no-browser", "--internal-host", "127.0.0.1", "--port", str(port)]
    log = data_dir / "label-studio.log"
    with log.open("wb") as written:
        process = subprocess.Popen(command, env=env, stdout=written, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield StartedLabelStudio(process, f"http://127.0.0.1:{port}", log)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=30)


def answering(started: StartedLabelStudio) -> str:
    """Its URL, once it answers /health (its first start migrates a new database: half a minute)."""
    deadline = time.monotonic() + LABEL_STUDIO_STARTUP_S
    while True:
        if started.process.poll() is not None:
            raise RuntimeError(f"Label Studio ended: {started.log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError("Label Studio did not answer /health in time")
        try:
            if httpx.get(f"{started.url}/health", timeout=2).status_code == 200:
                return started.url
        except httpx.TransportError:
            pass
        time.sleep(1)


@contextmanager
def media_server(
    files: dict[str, bytes], token: str, seconds_per_file: list[float] | None = None, requested: list[str] | None = None
) -> Iterator[str]:
    """A stand-in for Label Studio's media: ``files`` by path (as a request line has it: percent-encoded), to a
    request with ``Authorization: Token <token>`` (404 for any other path, 401 without the key), each after
    ``seconds_per_file[0]`` (a server's latency, changed as a test goes), each path noted in ``requested``; on
    127.0.0.1, stopped at the end. Yields its base URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Media(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(seconds_per_file[0] if seconds_per_file else 0.0)
            if requested is not None:
                requested.append(self.path)
            data = files.get(self.path)
            status = 401 if self.headers.get("Authorization") != f"Token {token}" else 200 if data else 404
            self.send_response(status)
            self.end_headers()
            if status == 200 and data is not None:
                self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Media)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=30)
