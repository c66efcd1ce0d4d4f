"""The instance's emulated disk: its size in instance.json, ``df``, and pulls that fill it.

Stand-in tests run ``ollama serve`` and ``df`` as real subprocesses on a temporary
instance file; the end-to-end test drives a real sandbox session over real SSH with
the plugin's own free-disk probe. Waits poll with generous bounds.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest
from polling import wait_for
from standin_helpers import CATALOG, Server, write_instance

from pytest_gpubench.remote.sysinfo import DISK_PROBE, parse_host_probe
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.sandbox.df_standin import default_models_dir, human_size, no_space_error
from pytest_gpubench.sandbox.instance_spec import GIB, InstanceSpec
from pytest_gpubench.sandbox.instances import instance_document

TIME_SCALE = 0.01
SYSTEM = 15 * GIB
# A 20 GB disk holds the system and 5 GiB of models: qwen2:7b (4.4 GB), not llama3:8b after it.
SMALL_DISK_GB = 20
POSIX_HEADER = ["Filesystem", "1024-blocks", "Used", "Available", "Capacity", "Mounted", "on"]


def small_disk_instance(directory: Path, **ollama: Any) -> Path:
    """A stand-in instance file with a 20 GB disk (and ``ollama`` overrides)."""
    path = write_instance(directory)
    spec = json.loads(path.read_text())
    spec["disk"] = {"size_gb": SMALL_DISK_GB, "system_gb": 15}
    spec["ollama"].update(ollama)
    path.write_text(json.dumps(spec))
    return path


def run_df(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_gpubench.sandbox.df_standin", *args],
        env=server.env, capture_output=True, text=True, timeout=60, cwd=server.instance.parent,
    )


def parse_posix(stdout: str) -> list[dict[str, Any]]:
    """Rows of ``df -P`` output, checked against the POSIX header."""
    header, *rows = stdout.splitlines()
    assert header.split() == POSIX_HEADER
    parsed = []
    for row in rows:
        filesystem, total, used, available, capacity, mounted = row.split()
        parsed.append({"filesystem": filesystem, "total": int(total), "used": int(used),
                       "available": int(available), "capacity": capacity, "mounted": mounted})
    return parsed


def disk_k(server: Server) -> dict[str, Any]:
    """The one row of ``df -Pk``; checks that it adds up."""
    result = run_df(server, "-Pk", ".")
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    (row,) = parse_posix(result.stdout)
    assert row["filesystem"] == "overlay" and row["mounted"] == "/"
    assert row["total"] == SMALL_DISK_GB * GIB // 1024
    assert row["used"] + row["available"] == row["total"]
    assert row["capacity"] == f"{-(-row['used'] * 100 // row['total'])}%"
    return row


def models(server: Server) -> list[str]:
    return sorted(m["name"] for m in server.http.get("/api/tags").json()["models"])


def pull_stream(server: Server, model: str) -> list[dict[str, Any]]:
    with server.http.stream("POST", "/api/pull", json={"model": model}) as response:
        assert response.status_code == 200
        return [json.loads(line) for line in response.iter_lines() if line.strip()]


def size_k(model: str) -> float:
    return CATALOG[model]["size_bytes"] / 1024


# -- the instance file ------------------------------------------------------------------


def test_instance_file_carries_the_disk_from_the_request_or_the_provider(tmp_path: Path) -> None:
    catalog = load_catalog()
    vastai = catalog.offer("vastai-18430202")
    tensordock = catalog.offer("tensordock-4c4c246a-5a67-41ee-8fbc-0893fe52c652-geforcertx4090-pcie-24gb")
    assert vastai is not None and tensordock is not None

    def disk(offer: Any, requested: int) -> dict[str, Any]:
        document = instance_document(catalog, offer, "s", 0.01, tmp_path, disk_gb=requested)
        return InstanceSpec.model_validate(document).disk.model_dump()

    # Vast.ai: the session's disk_gb, else 50 GB; TensorDock always 100 GB.
    assert disk(vastai, 0) == {"size_gb": 50, "system_gb": 15, "filesystem": "overlay"}
    assert disk(vastai, 80)["size_gb"] == 80
    assert disk(tensordock, 0)["size_gb"] == 100 and disk(tensordock, 30)["size_gb"] == 100
    # A file from before disks were emulated still reads, as a default Vast.ai disk.
    old = write_instance(tmp_path / "old")
    assert InstanceSpec.model_validate_json(old.read_text()).disk.size_bytes == 50 * GIB


def test_the_error_names_the_partial_blob_where_ollama_keeps_models() -> None:
    assert default_models_dir({"HOME": "/root"}) == "/root/.ollama/models"
    assert default_models_dir({"HOME": "/root", "OLLAMA_MODELS": "/data/m"}) == "/data/m"
    assert no_space_error("/root/.ollama/models", "sha256:" + "ab" * 32) == (
        f"write /root/.ollama/models/blobs/sha256-{'ab' * 32}-partial: no space left on device"
    )


@pytest.mark.parametrize(
    ("n_bytes", "base", "text"),
    [(0, 1024, "0"), (1023, 1024, "1023"), (1024, 1024, "1.0K"), (50 * GIB, 1024, "50G"),
     (int(4.13 * GIB), 1024, "4.2G"), (int(9.99 * GIB), 1024, "10G"), (1023 * GIB + 1, 1024, "1.0T"),
     (50 * GIB, 1000, "54G"), (1500, 1000, "1.5k")],
)
def test_human_sizes_round_up_like_gnu_df(n_bytes: int, base: int, text: str) -> None:
    assert human_size(n_bytes, base) == text


# -- df and pulls on one stand-in ---------------------------------------------------------


def test_df_adds_up_and_a_pull_that_does_not_fit_fails_like_ollama(tmp_path: Path) -> None:
    server = Server(small_disk_instance(tmp_path / "inst"))
    try:
        empty = disk_k(server)
        assert empty["used"] == SYSTEM // 1024

        server.pull("qwen2:7b")
        after_pull = disk_k(server)
        assert after_pull["used"] - empty["used"] == pytest.approx(size_k("qwen2:7b"), abs=1)

        # llama3:8b needs more than is left: the stream ends with Ollama's error line.
        before = models(server)
        lines = pull_stream(server, "llama3:8b")
        error = lines[-1]["error"]
        blob = lines[-2]["digest"]
        blobs = Path(server.env["HOME"]) / ".ollama" / "models" / "blobs"
        assert error == f"write {blobs}/{blob.replace(':', '-')}-partial: no space left on device"
        assert lines[-2]["completed"] < lines[-2]["total"]
        assert models(server) == before == ["qwen2:7b"]
        # What it wrote stays on the disk, as Ollama's -partial file does: the disk is full.
        full = disk_k(server)
        assert full["available"] == 0 and full["capacity"] == "100%"

        # The CLI says the same, as `Error: ...`, exit 1; not answered whole either.
        cli = server.cli("pull", "llama3:8b")
        assert cli.returncode == 1 and cli.stderr.strip().splitlines()[-1] == f"Error: {error}"
        whole = server.http.post("/api/pull", json={"model": "llama3:8b", "stream": False})
        assert (whole.status_code, whole.json()) == (500, {"error": error})

        # `ollama rm` frees the model's space; the pull then resumes and fits.
        removed = server.cli("rm", "qwen2:7b")
        assert removed.returncode == 0, removed.stderr
        state = json.loads((tmp_path / "inst" / "state" / "ollama_models.json").read_text())
        assert state["models"] == []
        assert disk_k(server)["available"] == pytest.approx(size_k("qwen2:7b"), abs=1)
        server.pull("llama3:8b")
        assert models(server) == ["llama3:8b"]
        done = disk_k(server)
        assert done["used"] - empty["used"] == pytest.approx(size_k("llama3:8b"), abs=1)
        assert json.loads((tmp_path / "inst" / "state" / "ollama_downloads.json").read_text()) == {"blobs": {}}

        # A delete over the API frees it again.
        assert server.http.request("DELETE", "/api/delete", json={"model": "llama3:8b"}).status_code == 200
        assert disk_k(server) == empty
    finally:
        server.stop()


def test_a_pull_in_progress_fills_the_disk_and_a_restart_prunes_what_it_left(tmp_path: Path) -> None:
    # 5 MB/s at time scale 0.01: qwen2:7b takes ~9 s, far longer than one df call.
    instance = small_disk_instance(tmp_path / "inst", pull_mb_per_s=5.0)
    server = Server(instance)
    try:
        with server.http.stream("POST", "/api/pull", json={"model": "qwen2:7b"}) as response:
            for line in response.iter_lines():
                if json.loads(line).get("completed"):
                    break
            during = disk_k(server)
        # The client went away mid-pull: the bytes written so far stay counted.
        assert SYSTEM // 1024 < during["used"] < SYSTEM // 1024 + size_k("qwen2:7b")
        assert models(server) == []
    finally:
        server.stop()
    restarted = Server(instance)
    try:
        assert disk_k(restarted)["used"] == SYSTEM // 1024
    finally:
        restarted.stop()


def test_df_on_a_missing_path_fails_like_df(tmp_path: Path) -> None:
    server = Server(small_disk_instance(tmp_path / "inst"))
    try:
        missing = tmp_path / "nope"
        only = run_df(server, "-Pk", str(missing))
        assert (only.returncode, only.stdout) == (1, "")
        assert only.stderr == f"df: {missing}: No such file or directory\n"
        mixed = run_df(server, "-P", str(missing), str(tmp_path))
        assert mixed.returncode == 1 and len(parse_posix(mixed.stdout)) == 1
        bad = run_df(server, "-Z")
        assert bad.returncode == 1 and bad.stderr.splitlines()[0] == "df: invalid option -- 'Z'"
        for args in ((), ("-k",), ("-h",)):
            shown = run_df(server, *args)
            assert shown.returncode == 0, shown.stderr
            header, row = shown.stdout.splitlines()
            assert header.split()[-2:] == ["Mounted", "on"]
            assert row.split()[0] == "overlay" and row.split()[-1] == "/"
        assert run_df(server, "-h").stdout.splitlines()[1].split()[1:5] == ["20G", "15G", "5.0G", "75%"]
    finally:
        server.stop()


# -- a sandbox session over SSH -------------------------------------------------------


def ssh(session: dict[str, Any], key_pem: str, command: str) -> asyncssh.SSHCompletedProcess:
    async def go() -> asyncssh.SSHCompletedProcess:
        async with asyncssh.connect(
            session["ssh_host"], session["ssh_port"], username="root",
            client_keys=[asyncssh.import_private_key(key_pem)], known_hosts=None, agent_path=None, config=[],
        ) as conn:
            return await conn.run(command, check=False)

    return asyncio.run(go())


def test_session_disk_gb_sizes_the_instance_disk_seen_over_ssh(api: httpx.Client) -> None:
    body = {"consumer_id": f"disk-{uuid.uuid4().hex[:8]}", "offer_id": "vastai-18430102", "workload_type": "llm",
            "reservation_hours": 1, "disk_gb": SMALL_DISK_GB}
    created = api.post("/api/v1/sessions", json=body)
    assert created.status_code == 201, created.text
    session_id, key = created.json()["session"]["id"], created.json()["ssh_private_key"]
    try:
        def running() -> dict[str, Any] | None:
            session = api.get(f"/api/v1/sessions/{session_id}").json()
            assert session["status"] in ("provisioning", "running"), session
            return session if session["status"] == "running" else None

        session = wait_for(running, what="the session to run")
        assert session["disk_gb"] == SMALL_DISK_GB
        spec = json.loads(ssh(session, key, 'cat "$GPUBENCH_SANDBOX_INSTANCE"').stdout)
        assert spec["disk"] == {"size_gb": SMALL_DISK_GB, "system_gb": 15}

        # The plugin's own probe reads the emulated disk (the template's Ollama serves on start).
        def free() -> int | None:
            probe = ssh(session, key, DISK_PROBE)
            assert probe.exit_status == 0, probe.stderr
            return parse_host_probe(probe.stdout).disk_free_bytes

        assert free() == SMALL_DISK_GB * GIB - SYSTEM
        wait_for(lambda: ssh(session, key, "ollama list").exit_status == 0, what="ollama serve on start")
        pulled = ssh(session, key, "ollama pull qwen2:7b")
        assert pulled.exit_status == 0, pulled.stderr
        assert free() == SMALL_DISK_GB * GIB - SYSTEM - (4431400262 + 1023) // 1024 * 1024
        refused = ssh(session, key, "ollama pull llama3:8b")
        assert refused.exit_status == 1
        assert refused.stderr.strip().splitlines()[-1].endswith("-partial: no space left on device")
        assert free() == 0
        assert ssh(session, key, "ollama rm qwen2:7b && ollama pull llama3:8b").exit_status == 0
        assert ssh(session, key, "ollama list").stdout.split()[4] == "llama3:8b"
        missing = ssh(session, key, "df -P /no/such/dir")
        assert (missing.exit_status, missing.stderr) == (1, "df: /no/such/dir: No such file or directory\n")
    finally:
        api.delete(f"/api/v1/sessions/{session_id}")
