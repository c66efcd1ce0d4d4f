"""An Ollama stand-in server as a real subprocess, for tests that need one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from pytest_gpubench.sandbox.instances import free_port  # the sandbox's own choice of a port bound later

REPO = Path(__file__).resolve().parents[1]
RATE = 200.0  # qwen2:7b tokens per second in the test catalog
TTFT_MS = 40.0
THINKING_MODEL = "deepseek-r1:1.5b"
THINKING_RATE = 250.0
THINKING_TTFT_MS = 30.0

CATALOG = {
    "qwen2:7b": {
        "size_bytes": 4431400262,
        "family": "qwen2",
        "parameter_size": "7.6B",
        "quantization_level": "Q4_0",
        "digest": "sha256:" + "d" * 64,
        "tokens_per_second": RATE,
        "ttft_ms": TTFT_MS,
        "load_seconds": 3.0,
    },
    "phi3:mini": {
        "size_bytes": 2176178913,
        "family": "phi3",
        "parameter_size": "3.8B",
        "quantization_level": "Q4_0",
        "digest": "sha256:" + "a" * 64,
        "tokens_per_second": 300.0,
        "ttft_ms": 25.0,
        "load_seconds": 2.0,
    },
    "tinyllama:latest": {
        "size_bytes": 637700138,
        "family": "llama",
        "parameter_size": "1.1B",
        "quantization_level": "Q4_0",
        "digest": "sha256:" + "b" * 64,
        "tokens_per_second": 400.0,
        "ttft_ms": 10.0,
        "load_seconds": 1.0,
    },
    "llama3:8b": {
        "size_bytes": 4661224676,
        "family": "llama",
        "parameter_size": "8.0B",
        "quantization_level": "Q4_0",
        "digest": "sha256:" + "c" * 64,
        "tokens_per_second": 100.0,
        "ttft_ms": 50.0,
        "load_seconds": 3.0,
    },
    # A thinking-capable model: reasons first unless a request says think: false.
    THINKING_MODEL: {
        "size_bytes": 1117322599,
        "family": "qwen2",
        "parameter_size": "1.8B",
        "quantization_level": "Q4_K_M",
        "digest": "sha256:" + "e" * 64,
        "tokens_per_second": THINKING_RATE,
        "ttft_ms": THINKING_TTFT_MS,
        "load_seconds": 1.0,
        "thinking": True,
    },
}


def write_instance(directory: Path, memory_mib: int = 24564, ram_gib: float = 64) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = {
        "session_id": f"test-{directory.name}",
        "time_scale": 0.01,
        "gpu": {
            "gpu_type": "RTX 4090",
            "name": "NVIDIA GeForce RTX 4090",
            "memory_mib": memory_mib,
            "count": 1,
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "power_limit_w": 450,
            "compute_capability": "8.9",
        },
        "host": {"cpu_model": "AMD EPYC 7543 32-Core Processor", "cpu_cores": 16, "ram_gib": ram_gib},
        "ollama": {"version": "0.5.7", "pull_mb_per_s": 250.0, "install_seconds": 30.0},
        "models": CATALOG,
        "state_dir": str(directory / "state"),
    }
    path = directory / "instance.json"
    path.write_text(json.dumps(spec))
    return path


def standin_env(instance: Path, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "GPUBENCH_SANDBOX_"))}
    env.update(
        GPUBENCH_SANDBOX_INSTANCE=str(instance),
        OLLAMA_HOST=f"127.0.0.1:{port}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        **extra,
    )
    return env


class Server:
    """An ``ollama serve`` subprocess and an HTTP client for it."""

    def __init__(self, instance: Path, **env: str) -> None:
        self.instance = instance
        self.port = free_port()
        self.env = standin_env(instance, self.port, **env)
        self.url = f"http://127.0.0.1:{self.port}"
        # A file, not a pipe: the server logs a line per request, and a pipe nobody
        # reads fills up and freezes it under a long load.
        self.log_path = instance.parent / f"ollama-serve-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest_gpubench.sandbox.ollama_standin", "serve"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.http = httpx.Client(base_url=self.url, timeout=30.0, trust_env=False)
        deadline = time.monotonic() + 15
        while True:
            try:
                if self.http.get("/api/version").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_gpubench.sandbox.ollama_standin", *args],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def pull(self, model: str) -> None:
        response = self.http.post("/api/pull", json={"model": model, "stream": False})
        assert response.json() == {"status": "success"}

    def stream(self, path: str, body: dict[str, Any]) -> tuple[float, list[tuple[float, dict[str, Any]]]]:
        """Send a streamed request; the send time and each chunk with its arrival time."""
        chunks = []
        sent = time.perf_counter()
        with self.http.stream("POST", path, json=body) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.strip():
                    chunks.append((time.perf_counter(), json.loads(line)))
        return sent, chunks

    def stop(self) -> int:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
