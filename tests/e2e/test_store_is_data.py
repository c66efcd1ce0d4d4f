"""Issue 21 items 1, 2 and 9: what a (shared) store says is data, never a path to write to or an
address to send the token to. Real SQLite manifests, the sandbox API and a real HTTP server that
records what reaches it; ``gpubench cleanup`` as a user runs it."""

from __future__ import annotations

import http.server
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from e2e_helpers import RENTABLE_OFFER, SANDBOX_TOKEN, rent, session_status

from pytest_gpubench.cloud.processes import ProcessIdentity, start_token
from pytest_gpubench.cloud.provider import consumer_id
from pytest_gpubench.commands.cli import main as gpubench
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.progress import ProgressWriter

#: The token the user configured: the test sandbox's (its API answers 401 to any other), never sent elsewhere.
TOKEN = SANDBOX_TOKEN


def dead_process() -> ProcessIdentity:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    token = start_token(child.pid)
    child.wait()
    return ProcessIdentity(pid=child.pid, host=socket.gethostname(), start=token)


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]]

    def _answer(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        body = b'{"sessions": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def elsewhere() -> Iterator[tuple[str, list]]:
    """An HTTP server a store row may name: its URL and every request that reached it."""
    seen: list = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def running_cell(manifest: Manifest, run_id: str, cell: str, session_id: str, progress_file: str) -> str:
    row_id = manifest.add_cell(run_id, cell, gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                               matrix_file="m.yaml")
    manifest.update_cell(row_id, status="running", worker="gw0", progress_file=progress_file)
    manifest.record_session(row_id, session_id=session_id, consumer_id=consumer_id(run_id, cell),
                            offer_id=RENTABLE_OFFER, price_per_hour=0.16)
    return row_id


def test_cleanup_writes_progress_lines_only_under_the_configured_folder(tmp_path, sandbox, api, capsys):
    # Item 1: a row's progress_file naming ~/.bashrc got a line with the row's text in it,
    # from `gpubench cleanup` and from the sweep at the start of every run.
    home = tmp_path / "home"
    home.mkdir()
    bashrc = home / ".bashrc"
    bashrc.write_text("export PATH=$PATH\n")
    staged = tmp_path / "elsewhere.log"  # a file that says the cell got to the benchmark stage
    writer = ProgressWriter(staged)
    writer.status("MODEL_READY")
    writer.close()
    reports = tmp_path / "reports"
    own = reports / "progress" / "dead" / "cell-b.log"
    writer = ProgressWriter(own)
    writer.status("STARTING")
    writer.status("INVENTORY_QUERY")
    writer.close()
    linked = reports / "progress" / "dead" / "cell-c.log"
    linked.symlink_to(home / "profile")
    path = tmp_path / "manifest.db"
    with Manifest(path) as manifest:
        manifest.start_run("dead", argv=[], matrix_files=[], owner=dead_process(), api=sandbox.url)
        a = running_cell(manifest, "dead", "cell-a", rent(api, consumer_id("dead", "cell-a")), str(bashrc))
        b = running_cell(manifest, "dead", "cell-b", rent(api, consumer_id("dead", "cell-b")), str(staged))
        c = running_cell(manifest, "dead", "cell-c", rent(api, consumer_id("dead", "cell-c")), str(bashrc))

    assert gpubench(["cleanup", "--store", str(path), "--api", sandbox.url, "--reports", str(reports)]) == 0
    out = capsys.readouterr().out
    assert out.count("released session") == 3 and "marked failed: cell dead/cell-a" in out
    assert bashrc.read_text() == "export PATH=$PATH\n"
    assert not (home / "profile").exists() and linked.is_symlink()
    lines = own.read_text()
    assert "STATUS: CLEANUP" in lines and "by=\"gpubench cleanup\"" in lines and "ERROR: stage=provision" in lines
    with Manifest(path) as manifest:
        # The stage comes from the cell's own file, never from the file a row names.
        stages = {row: manifest.cell(row)["failure_stage"] for row in (a, b, c)}
    assert stages == {a: "inventory", b: "provision", c: "inventory"}


@pytest.mark.parametrize("configured_in", ["environment", "ini"])
def test_cleanup_sends_the_token_only_to_the_configured_api(tmp_path, sandbox, api, elsewhere, capsys,
                                                            monkeypatch, configured_in):
    # Item 2: a row's runs.api got GET /health, GET /api/v1/sessions, POST .../done with the token.
    # Issue 22 item 6: an API set only in the ini file pytest reads is the configured one for cleanup too.
    other, seen = elsewhere
    path = tmp_path / "manifest.db"
    ours = rent(api, consumer_id("ours", "c1"))
    with Manifest(path) as manifest:
        manifest.start_run("ours", argv=[], matrix_files=[], owner=dead_process(), api=sandbox.url + "/")
        running_cell(manifest, "ours", "c1", ours, "")
        manifest.start_run("theirs", argv=[], matrix_files=[], owner=dead_process(),
                           api=other.replace("http://", "http://mallory:pw@"))
        running_cell(manifest, "theirs", "c2", "22222222-2222-4222-8222-222222222222", "")
    monkeypatch.setenv("GPUBENCH_API_TOKEN", TOKEN)
    if configured_in == "environment":
        monkeypatch.setenv("GPUBENCH_API_BASE", sandbox.url)
    else:
        monkeypatch.delenv("GPUBENCH_API_BASE", raising=False)
        (tmp_path / "project").mkdir()
        (tmp_path / "project" / "pytest.ini").write_text(f"[pytest]\ngpubench_api = {sandbox.url}\n")
        monkeypatch.chdir(tmp_path / "project")
    assert gpubench(["cleanup", "--store", str(path), "--reports", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert seen == []
    assert f"released session {ours}" in out and session_status(api, ours) == "stopped"
    shown = other.replace("http://", "http://mallory:***@")
    assert (f"left alone session 22222222-2222-4222-8222-222222222222 (run theirs, cell c2) (run theirs used the "
            f"API at {shown}: gpubench cleanup --api {shown})") in out
    assert "pw@" not in out


def test_the_api_url_is_stored_and_shown_without_its_password(tmp_path, sandbox, api, capsys):
    # Item 9: runs.api kept https://user:pass@..., which gpubench browse and cleanup showed.
    path = tmp_path / "manifest.db"
    with Manifest(path) as manifest:
        manifest.start_run("r1", argv=[], matrix_files=[], owner=dead_process(),
                           api="https://alice:hunter2@shopper.example:8443/base")
    with sqlite3.connect(path) as db:
        stored = db.execute("SELECT api FROM runs WHERE run_id = 'r1'").fetchone()[0]
    assert stored == "https://alice:***@shopper.example:8443/base"
    # A row an older version stored raw is not shown raw either.
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET api = 'http://bob:pw2@127.0.0.1:9' WHERE run_id = 'r1'")
    with Manifest(path) as manifest:
        running_cell(manifest, "r1", "c1", "33333333-3333-4333-8333-333333333333", "")
    assert gpubench(["cleanup", "--store", str(path), "--api", sandbox.url, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pw2" not in out and "gpubench cleanup --api http://bob:***@127.0.0.1:9" in out


def test_a_session_id_from_the_store_is_never_sent_to_the_api(tmp_path, elsewhere, capsys, monkeypatch):
    # Item 8: a row's session id "../../admin/users" became GET/DELETE /admin/users with the token.
    configured, seen = elsewhere
    path = tmp_path / "manifest.db"
    with Manifest(path) as manifest:
        manifest.start_run("r1", argv=[], matrix_files=[], owner=dead_process(), api=configured)
        running_cell(manifest, "r1", "c1", "../../admin/users", "")
    monkeypatch.setenv("GPUBENCH_API_TOKEN", TOKEN)
    assert gpubench(["cleanup", "--store", str(path), "--api", configured]) == 0
    out = capsys.readouterr().out
    assert [path for _, path, _ in seen if "admin" in path or "sessions/" in path] == []
    assert "left alone session '../../admin/users' (run r1, cell c1) (its session id is not a valid id" in out
