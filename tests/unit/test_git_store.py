"""The git store with real git: a bare repository on disk, a clone per store, pushes that race.

Each store here stands for one machine (its own local manifest and clone); the contract
suite (test_store_contract.py) holds the same store to the ``Store`` promises.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_gpubench.errors import StoreProblem, UsageProblem
from pytest_gpubench.store.git_repo import run_git
from pytest_gpubench.store.git_store import GitStore, GitStoreWarning
from pytest_gpubench.store.opening import open_store, store_exists
from result_helpers import make_result

RUN = "phase1"
TESTS = Path(__file__).resolve().parents[1]


def url(tmp_path: Path) -> str:
    return f"git+file://{tmp_path}/results.git"


def machine(tmp_path: Path, name: str, **options) -> GitStore:
    """A store as machine ``name`` opens it: its own manifest and clone, the shared repository."""
    return GitStore.open(url(tmp_path), manifest=tmp_path / name / "manifest.db", cache_dir=tmp_path / name / "cache",
                         **options)


def add(store: GitStore, cell: str) -> str:
    return store.add_cell(RUN, cell, gpu_type="RTX 4090", provider="local", model="qwen2:7b",
                          matrix_file="matrix/phase1.yaml")


def checkout(tmp_path: Path) -> Path:
    """A fresh clone of the repository as it is on the remote now."""
    target = tmp_path / f"inspect-{time.monotonic_ns()}"
    run_git("clone", "-q", f"{tmp_path}/results.git", str(target))
    return target


def test_the_repository_holds_seed_002_s_layout(tmp_path):
    with machine(tmp_path, "a") as store:
        store.start_run(RUN, ["pytest"], ["matrix/phase1.yaml"])
        rows = [add(store, name) for name in ("RTX_4090-local-qwen2:7b", "RTX_4090-local-llama3:8b")]
        claim = store.claim_cell(rows[0], "box-a/gw0", lease_seconds=60, now=1000.0)
        assert claim.won and claim.lease_expires_at == 1060.0
        repo = checkout(tmp_path)
        assert (repo / "data/phase/phase1.txt").read_text() == "RTX_4090-local-qwen2_7b\nRTX_4090-local-llama3_8b\n"
        claimed = json.loads((repo / "data/runs/claims/phase1/RTX_4090-local-qwen2_7b.json").read_text())
        assert (claimed["holder"], claimed["since"], claimed["lease_expires_at"]) == ("box-a/gw0", claim.since, 1060.0)
        assert claimed["cell"]["cell_id"] == "RTX_4090-local-qwen2:7b" and claimed["cell"]["gpu_type"] == "RTX 4090"

        result_id = store.add_result(rows[0], make_result(72.5))
        store.finish_cell(rows[0], status="success")
        store.finish_cell(rows[1], status="failed", failure_stage="model_pull", failure_reason="no_space")
        repo = checkout(tmp_path)
        assert (repo / "data/phase/phase1.txt").read_text() == ""
        assert not list((repo / "data/runs/claims").rglob("*.json"))
        done = json.loads((repo / "data/runs/phase1/RTX_4090-local-qwen2_7b.json").read_text())
        assert done["cell"]["status"] == "success" and done["cell"]["worker"] == "box-a/gw0"
        assert done["result"]["id"] == result_id and done["result"]["results"]["avg_tokens_per_second"] == 72.5
        failed = json.loads((repo / "data/runs/phase1/RTX_4090-local-llama3_8b.json").read_text())
        assert (failed["cell"]["status"], failed["cell"]["failure_stage"], failed["result"]) == (
            "failed", "model_pull", None)
        authors = run_git("log", "--format=%an <%ae>", cwd=repo).stdout.split("\n")
        assert set(filter(None, authors)) == {"gpubench <gpubench@localhost>"}


def test_a_cell_with_a_result_is_skipped_by_every_other_machine(tmp_path):
    with machine(tmp_path, "a") as a, machine(tmp_path, "b") as b:
        row = add(a, "cell-1")
        assert a.claim_cell(row, "a").won
        a.add_result(row, make_result(70.0))
        a.finish_cell(row, status="success")
        assert add(b, "cell-1") == row
        claim = b.claim_cell(row, "b")
        assert (claim.won, claim.status, claim.holder) == (False, "success", "a")
        # b adding the cell did not put it back on the TODO list
        b.cells()
        assert (checkout(tmp_path) / "data/phase/phase1.txt").read_text() == ""
        seen = b.cell(row)
        assert (seen.status, seen.worker, seen.decode_tokens_per_second) == ("success", "a", 70.0)


def test_an_expired_claim_is_taken_over_and_its_holder_cannot_renew(tmp_path):
    with machine(tmp_path, "a") as a, machine(tmp_path, "b") as b:
        row = add(a, "cell-1")
        add(b, "cell-1")
        assert a.claim_cell(row, "a", lease_seconds=30, now=1000.0).won
        assert a.renew_cell_lease(row, "a", 30, now=1020.0)  # held until 1050
        held = b.claim_cell(row, "b", lease_seconds=30, now=1040.0)
        assert (held.won, held.holder, held.lease_expires_at) == (False, "a", 1050.0)
        taken = b.claim_cell(row, "b", lease_seconds=30, now=1051.0)
        assert taken.won and taken.taken_over_from == "a" and taken.holder == "b"
        assert not a.renew_cell_lease(row, "a", 30, now=1052.0)
        seen = a.cell(row)
        assert (seen.status, seen.worker, seen.lease_expires_at) == ("running", "b", 1081.0)


def test_workers_of_one_name_on_two_machines_are_two_workers(tmp_path):
    with machine(tmp_path, "a", host="box-a") as a, machine(tmp_path, "b", host="box-b") as b:
        row = add(a, "cell-1")
        add(b, "cell-1")
        assert a.claim_cell(row, "main", lease_seconds=60).won
        held = b.claim_cell(row, "main", lease_seconds=60)
        assert (held.won, held.holder) == (False, "main@box-a")
        assert not b.renew_cell_lease(row, "main", 60)
        # b's cleanup closing what looks running to it keeps to b's manifest: a's claim stands.
        b.finish_cell(row, status="failed", failure_reason="interrupted")
        seen = b.cell(row)
        assert (seen.status, seen.worker) == ("running", "main@box-a")
        assert a.cell(row).worker == "main"
        a.finish_cell(row, status="success")
        assert (b.cell(row).status, b.cell(row).worker) == ("success", "main@box-a")
        assert b.claim_cell(row, "main").holder == "main@box-a"


def test_a_machine_that_was_taken_over_writes_nothing_more_of_the_cell(tmp_path):
    """The guarded writes check the repository's claim file, not only the local manifest (which
    still says running under the old holder on the machine that lost the cell)."""
    with machine(tmp_path, "a", host="box-a") as a, machine(tmp_path, "b", host="box-b") as b:
        row = add(a, "cell-1")
        add(b, "cell-1")
        assert a.claim_cell(row, "main", lease_seconds=30, now=1000.0).won
        assert b.claim_cell(row, "main", lease_seconds=60).won  # a's lease ran out long ago
        assert a.update_cell(row, if_held_by="main", progress_file="/tmp/late") is False
        assert a.record_session(row, session_id="s-late", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="main") is False
        assert a.finish_cell(row, status="success", if_held_by="main") is False
        assert a.restart_cell(row) is False
        seen = a.cell(row)
        assert (seen.status, seen.worker, seen.session_id, seen.progress_file) == ("running", "main@box-b", None, None)
        repo = checkout(tmp_path)
        claimed = json.loads((repo / "data/runs/claims/phase1/cell-1.json").read_text())
        assert (claimed["holder"], claimed["host"]) == ("main", "box-b")
        assert b.record_session(row, session_id="s-b", consumer_id="c", offer_id="o", price_per_hour=1.0,
                                if_held_by="main")
        assert b.finish_cell(row, status="success", if_held_by="main") is True
        assert (a.cell(row).status, a.cell(row).worker) == ("success", "main@box-b")
        assert not (checkout(tmp_path) / "data/runs/claims/phase1/cell-1.json").exists()


def test_a_same_host_process_does_not_publish_over_another_process_s_live_claim(tmp_path):
    """Review 13, finding 13: two processes of one host name (containers, or cleanup) with their own
    manifests: the one whose claim was taken over cannot publish its end over the live claim."""
    with machine(tmp_path, "a", host="box") as a, machine(tmp_path, "b", host="box") as b:
        row = add(a, "cell-1")
        add(b, "cell-1")
        assert a.claim_cell(row, "box:1", lease_seconds=30, now=1000.0).won
        taken = b.claim_cell(row, "box:2", lease_seconds=60)
        assert taken.won and taken.taken_over_from == "box:1"
        a.finish_cell(row, status="failed", failure_reason="interrupted")  # unguarded, as cleanup writes today
        repo = checkout(tmp_path)
        claimed = json.loads((repo / "data/runs/claims/phase1/cell-1.json").read_text())
        assert claimed["holder"] == "box:2"
        assert not (repo / "data/runs/phase1/cell-1.json").exists()
        assert (b.cell(row).status, b.cell(row).worker) == ("running", "box:2")


def _push_after(store: GitStore, other_push) -> list[bool]:
    """Make ``other_push`` (another machine's real push) land between ``store``'s sync and its next push."""
    real_push, answers = store.clone.push, []

    def push() -> bool:
        if not answers:
            other_push()
        answers.append(real_push())
        return answers[-1]

    store.clone.push = push
    return answers


def test_a_push_rejected_by_a_concurrent_push_is_retried(tmp_path):
    with machine(tmp_path, "a") as a, machine(tmp_path, "b") as b:
        first, second = add(a, "cell-1"), add(b, "cell-2")
        add(a, "cell-2"), add(b, "cell-1")
        pushes = _push_after(b, lambda: a.claim_cell(first, "a"))
        assert b.claim_cell(second, "b").won
        assert pushes == [False, True]  # lost the race to a's push, then pushed over it
        claims = checkout(tmp_path) / "data/runs/claims/phase1"
        assert sorted(path.name for path in claims.iterdir()) == ["cell-1.json", "cell-2.json"]


def test_a_claim_pushed_first_by_another_machine_wins_the_cell(tmp_path):
    with machine(tmp_path, "a") as a, machine(tmp_path, "b") as b:
        row = add(a, "cell-1")
        add(b, "cell-1")
        pushes = _push_after(b, lambda: a.claim_cell(row, "a"))
        claim = b.claim_cell(row, "b")
        assert (claim.won, claim.holder) == (False, "a")
        assert pushes == [False]  # its claim file never reached the remote
        assert b.cell(row).worker == "a"


def test_a_result_whose_push_fails_stays_and_goes_with_the_next_push(tmp_path):
    with machine(tmp_path, "a", push_tries=2) as a:
        row = add(a, "cell-1")
        assert a.claim_cell(row, "a").won
        bare, away = tmp_path / "results.git", tmp_path / "moved.git"
        bare.rename(away)  # the remote is gone for a while
        with pytest.warns(GitStoreWarning, match=r"could not push after 2 tries.*1 cell\(s\) stay in the local"):
            a.finish_cell(row, status="success")
        assert a.manifest.cell(row)["status"] == "success"
        away.rename(bare)
        assert a.cell(row).status == "success"  # the next operation pushed it
        again = add(a, "cell-2")
        assert a.claim_cell(again, "a", lease_seconds=30).won
        bare.rename(away)
        with pytest.raises(StoreProblem, match="could not push the lease"):
            a.renew_cell_lease(again, "a", 30)  # not False: the claim is still a's
        away.rename(bare)
        assert a.renew_cell_lease(again, "a", 30)
    done = json.loads((checkout(tmp_path) / "data/runs/phase1/cell-1.json").read_text())
    assert done["cell"]["status"] == "success"


def test_a_result_a_closing_store_could_not_push_goes_with_the_next_store_of_the_machine(tmp_path):
    a = machine(tmp_path, "a", push_tries=1)
    row = add(a, "cell-1")
    assert a.claim_cell(row, "a").won
    bare, away = tmp_path / "results.git", tmp_path / "moved.git"
    bare.rename(away)
    with pytest.warns(GitStoreWarning):
        a.finish_cell(row, status="success")
    with pytest.warns(GitStoreWarning, match="next git store of this machine on the same manifest pushes them"):
        a.close()
    away.rename(bare)
    with machine(tmp_path, "a") as again:
        assert again.cells(RUN)[0].status == "success"
    assert not list((tmp_path / "a" / "cache").rglob("*.unpushed.json"))
    done = json.loads((checkout(tmp_path) / "data/runs/phase1/cell-1.json").read_text())
    assert (done["cell"]["status"], done["cell"]["worker"]) == ("success", "a")


def test_another_machine_s_cells_show_as_the_repository_has_them(tmp_path):
    with machine(tmp_path, "a") as a, machine(tmp_path, "b") as b:
        a.start_run(RUN, [], [])
        rows = [add(a, f"gpu-local-m:{n}") for n in range(3)]
        assert a.claim_cell(rows[1], "a", lease_seconds=60, now=1000.0).won
        a.finish_cell(rows[2], status="skipped")
        seen = {cell.cell_id: cell for cell in b.cells(RUN)}  # b collected none of them
        assert seen["gpu-local-m_0"].status == "pending"
        running = seen["gpu-local-m:1"]
        assert (running.status, running.worker, running.lease_expires_at, running.gpu_type) == (
            "running", "a", 1060.0, "RTX 4090")
        assert seen["gpu-local-m:2"].status == "skipped"
        assert {cell.row_id for cell in b.cells()} == {cell.row_id for cell in seen.values()}
        b.start_run("b-own", [], [])
        assert b.run_ids() == ["b-own", RUN]  # its own runs first, then the repository's


def test_close_removes_the_clone_and_the_local_manifest_stays(tmp_path):
    store = machine(tmp_path, "a")
    clone = store.clone.directory
    assert clone.is_dir()
    store.close()
    assert not clone.exists() and (tmp_path / "a" / "manifest.db").is_file()


def test_a_killed_process_s_clone_is_removed_by_the_next_store(tmp_path):
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with machine(tmp_path, "a") as store:
        clones = store.clone.directory.parents[1]
        left = clones / f"{socket.gethostname()}-{killed.pid}-abc123"
        (left / "repo").mkdir(parents=True)
    killed.kill()
    killed.wait(timeout=30)
    with machine(tmp_path, "a"):
        assert not left.exists()


def test_open_store_and_store_exists_reach_the_git_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    location = url(tmp_path)
    assert not store_exists(location) and not (tmp_path / "results.git").exists()  # looking creates nothing
    with open_store(location, busy_timeout=5) as store:
        assert isinstance(store, GitStore) and store.location == location
        assert str(store.manifest.path).startswith(str(tmp_path / "xdg" / "gpubench" / "git"))
    assert store_exists(location)


@pytest.mark.parametrize("location", ["git+ftp://example.com/r.git", "git+file://", "git+https:///r.git",
                                      "git+ext::sh -c touch% /tmp/pwned"])
def test_a_url_git_should_not_be_given_is_refused(location):
    with pytest.raises(UsageProblem):
        GitStore.exists(location)


def test_an_unreachable_remote_is_a_problem_without_its_password():
    with pytest.raises(StoreProblem) as raised:
        GitStore.exists("git+http://user:s3cret@127.0.0.1:9/results.git")
    assert "s3cret" not in str(raised.value) and "127.0.0.1" in str(raised.value)


_RACER = textwrap.dedent("""
    import json, random, sys
    sys.path.insert(0, sys.argv[4])
    from pytest_gpubench.store.git_store import GitStore
    from result_helpers import make_result

    url, home, name = sys.argv[1:4]
    with GitStore.open(url, manifest=f"{home}/manifest.db", cache_dir=f"{home}/cache") as store:
        store.start_run("phase1", ["pytest"], [])
        rows = [store.add_cell("phase1", f"cell-{n:02d}", gpu_type="RTX 4090", provider="local",
                               model="qwen2:7b", matrix_file="m.yaml") for n in range(20)]
        random.Random(name).shuffle(rows)
        won, left = [], list(rows)
        while left:
            for row in list(left):
                claim = store.claim_cell(row, name, lease_seconds=600)
                if claim.won:
                    store.add_result(row, make_result(70.0))
                    store.finish_cell(row, status="success")
                    won.append(row)
                if claim.won or claim.status != "running":
                    left.remove(row)
        print(json.dumps(won))
""")


def test_three_machines_racing_run_every_cell_exactly_once(tmp_path):
    GitStore.open(url(tmp_path), cache_dir=tmp_path / "setup", manifest=tmp_path / "setup.db").close()
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, url(tmp_path), str(tmp_path / name), name, str(TESTS)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for name in ("box-a", "box-b", "box-c")]
    won = []
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err
        won.append(json.loads(out))
    every = [row for rows in won for row in rows]
    assert sorted(every) == [f"phase1/cell-{n:02d}" for n in range(20)]  # each exactly once
    repo = checkout(tmp_path)
    assert (repo / "data/phase/phase1.txt").read_text() == ""
    assert not list((repo / "data/runs/claims").rglob("*.json"))
    results = {path.stem: json.loads(path.read_text()) for path in (repo / "data/runs/phase1").glob("*.json")}
    assert sorted(results) == [f"cell-{n:02d}" for n in range(20)]
    holders = {f"phase1/{key}": found["cell"]["worker"] for key, found in results.items()}
    assert all(holders[row] == name for rows, name in zip(won, ("box-a", "box-b", "box-c")) for row in rows)
    assert all(found["result"]["results"]["avg_tokens_per_second"] == 70.0 for found in results.values())


def test_a_credential_url_leaves_no_secret_in_the_clone_or_the_messages(tmp_path):
    location = f"git+file://bench:s3cret@{tmp_path}/results.git"
    with GitStore.open(location, manifest=tmp_path / "manifest.db", cache_dir=tmp_path / "cache") as store:
        store.start_run(RUN, ["pytest", "--gpubench-store", location], [])
        config = (store.clone.directory / ".git" / "config").read_text()
        assert f"url = file://{tmp_path}/results.git" in config and "s3cret" not in config
        assert store.location == f"git+file://bench:***@{tmp_path}/results.git"
        assert "s3cret" not in json.dumps(store.manifest.run(RUN), default=str)  # runs.argv
        add(store, "cell-a")
    pushed = checkout(tmp_path)
    assert (pushed / "data/README.md").is_file()
    assert not [path for path in pushed.rglob("*") if path.is_file() and b"s3cret" in path.read_bytes()]


class _GitOverHttp:
    """``git http-backend`` behind Basic authentication: a real smart-HTTP remote that records
    the ``Authorization`` header of every request and refuses one without the right header."""

    def __init__(self, root: Path, user: str, password: str) -> None:
        import base64
        import http.server
        import threading

        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.seen: list[str | None] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._serve()

            def do_POST(self):
                self._serve()

            def _serve(self):
                outer.seen.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != outer.expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="results"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {"GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1", "REMOTE_USER": user,
                       "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": self.command,
                       "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
                       "PATH": "/usr/bin:/bin"}
                env.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in self.headers.items()})
                done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=True)
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                headers = [line.split(": ", 1) for line in head.decode().split("\r\n") if line]
                status = next((int(value.split()[0]) for name, value in headers if name == "Status"), 200)
                self.send_response(status)
                for name, value in headers:
                    if name != "Status":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _heads(repository: Path) -> list[str]:
    """The branches a bare repository has."""
    return run_git("--git-dir", str(repository), "for-each-ref", "--format=%(refname:short)",
                   "refs/heads").stdout.split()


@pytest.mark.parametrize("branch", ["master", "trunk"])
def test_an_empty_repository_s_results_go_to_the_branch_its_head_names(tmp_path, branch):
    """Issue 21 item 16: ``git init --bare`` where the default branch is not ``main``. Its HEAD is
    unborn (``ls-remote --symref`` says nothing): the store still pushes to the branch it names,
    so a plain ``git clone`` checks the results out (docs/git-mode.md's crash recovery)."""
    run_git("init", "--bare", "-q", f"--initial-branch={branch}", str(tmp_path / "results.git"))
    with machine(tmp_path, "a") as store:
        row = add(store, "cell-a")
        assert store.claim_cell(row, "gw0", lease_seconds=60).won
        used = store.clone.branch
    repo = checkout(tmp_path)  # a plain git clone: what HEAD names is checked out
    assert (repo / "data/runs/claims/phase1/cell-a.json").is_file(), sorted(p.name for p in repo.iterdir())
    assert json.loads((repo / "data/runs/claims/phase1/cell-a.json").read_text())["holder"] == "gw0"
    assert (used, _heads(tmp_path / "results.git")) == (branch, [branch])
    with machine(tmp_path, "b") as other:
        held = other.claim_cell(add(other, "cell-a"), "gw1", lease_seconds=60)
        assert not held.won and held.holder == "gw0"  # the claim the first one pushed


def test_an_empty_remote_over_http_gets_its_results_on_the_branch_its_head_names(tmp_path):
    """Not a file on this machine: the unborn HEAD is read from the fresh clone's own (git sets it)."""
    run_git("init", "--bare", "-q", "--initial-branch=trunk", str(tmp_path / "srv" / "results.git"))
    remote = _GitOverHttp(tmp_path / "srv", "tok", "")
    try:
        location = f"git+http://tok@127.0.0.1:{remote.port}/results.git"
        with GitStore.open(location, manifest=tmp_path / "m.db", cache_dir=tmp_path / "cache") as store:
            assert store.claim_cell(add(store, "cell-a"), "gw0", lease_seconds=60).won
    finally:
        remote.server.shutdown()
    assert _heads(tmp_path / "srv" / "results.git") == ["trunk"]  # nothing pushed to a main HEAD does not name


def test_a_repository_an_earlier_version_filled_on_main_under_another_head_stays_on_main(tmp_path):
    """An earlier version pushed to ``main`` whatever the empty repository's HEAD named: its results
    stay the record (HEAD still names a branch that does not exist)."""
    run_git("init", "--bare", "-q", "--initial-branch=master", str(tmp_path / "results.git"))
    with machine(tmp_path, "a", branch="main") as earlier:
        assert earlier.claim_cell(add(earlier, "cell-a"), "gw0", lease_seconds=60).won
    with machine(tmp_path, "b") as store:
        assert store.clone.branch == "main"
        assert not store.claim_cell(add(store, "cell-a"), "gw1", lease_seconds=60).won
    assert _heads(tmp_path / "results.git") == ["main"]


def test_an_https_token_reaches_git_as_a_header_and_never_the_clone_s_config(tmp_path):
    run_git("init", "--bare", "-q", "--initial-branch=main", str(tmp_path / "srv" / "results.git"))
    remote = _GitOverHttp(tmp_path / "srv", "ghp_s3cret", "")
    try:
        location = f"git+http://ghp_s3cret@127.0.0.1:{remote.port}/results.git"
        with GitStore.open(location, manifest=tmp_path / "m.db", cache_dir=tmp_path / "cache") as store:
            add(store, "cell-a")
            config = (store.clone.directory / ".git" / "config").read_text()
            assert f"url = http://127.0.0.1:{remote.port}/results.git" in config and "s3cret" not in config
        assert remote.seen and all(header == remote.expected for header in remote.seen)  # clone, fetch, push
        assert GitStore.exists(location)
        with pytest.raises(StoreProblem) as raised:  # the wrong token: refused, and not shown
            GitStore.open(f"git+http://ghp_wr0ng@127.0.0.1:{remote.port}/results.git",
                          manifest=tmp_path / "w.db", cache_dir=tmp_path / "cache-w")
        assert "wr0ng" not in str(raised.value) and "127.0.0.1" in str(raised.value)
    finally:
        remote.server.shutdown()
    run_git("--git-dir", str(tmp_path / "srv" / "results.git"), "rev-parse", "--verify", "main")  # pushed


def _basic_header(user: str, password: str) -> str:
    import base64

    return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(("url", "given", "header"), [
    ("https://u:p%40ss/w@git.example:8443/o/r.git", "https://git.example:8443/o/r.git",
     ("https://git.example:8443/", _basic_header("u", "p@ss/w"))),
    ("https://ghp_TOKEN@github.com/o/r.git", "https://github.com/o/r.git",
     ("https://github.com/", _basic_header("ghp_TOKEN", ""))),
    ("ssh://git:s3cret@host/r.git", "ssh://git@host/r.git", None),
    ("ssh://git@host/r.git", "ssh://git@host/r.git", None),
    ("file://u:s3cret@/srv/r.git", "file:///srv/r.git", None),
    ("git://u:s3cret@host/r.git", "git://host/r.git", None),
    ("https://host/r.git", "https://host/r.git", None),
])
def test_git_is_given_the_url_without_credentials_and_http_ones_as_a_header(url, given, header):
    from pytest_gpubench.store.git_repo import Remote

    remote = Remote.of(url)
    assert remote == (given, header)
    if header is None:
        assert remote.environment() == {}


def test_the_header_goes_after_the_configuration_the_environment_already_has(monkeypatch):
    from pytest_gpubench.store.git_repo import Remote

    monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    assert Remote.of("https://t@h/r.git").environment() == {
        "GIT_CONFIG_COUNT": "3", "GIT_CONFIG_KEY_2": "http.https://h/.extraHeader",
        "GIT_CONFIG_VALUE_2": _basic_header("t", "")}


def test_what_git_said_reaches_a_warning_as_one_plain_line_without_the_password():
    from pytest_gpubench.store.git_repo import _one_line

    said = _one_line("fatal: \x1b[31munable to access\x1b[0m\n'https://user:s3cret@git.example/r.git/'\x1b]8;;x\x07")
    assert "\x1b" not in said and "\n" not in said and "s3cret" not in said
    assert said.startswith("fatal: unable to access 'https://user:")
