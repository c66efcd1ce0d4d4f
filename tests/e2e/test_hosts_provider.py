"""Your own GPUs as providers, end to end: ``cloud: hosts`` on sandbox machines with real SSH on
loopback (no GPU Shopper API), ``cloud: local`` on this machine given the stand-ins, and the
host-key rules (known_hosts, pinning on first use, a changed key refused naming both keys)."""

from __future__ import annotations

import os
import socket
import textwrap
import time
from pathlib import Path

import pytest
import sqlite_utils
from e2e_helpers import manifest_rows, run_pytest

from pytest_gpubench.aio import run as run_async
from pytest_gpubench.errors import HostKeyChanged
from pytest_gpubench.remote.ssh import connect_checked, host_pattern
from pytest_gpubench.remote.ssh import Stage
from pytest_gpubench.sandbox.server import HostPlan, SandboxHostsThread, local_machine

MATRIX = """\
    cloud: {cloud}
    {hosts}
    workload: {{duration: 3s, max_tokens: 32, warmup_requests: 1}}
    matrix:
      - gpu: RTX 4090
        provider: {provider}
        models: [{models}]
    """


def write_matrix(tmp_path: Path, *, cloud: str, models: str, provider: str = "hosts", hosts: str = "") -> Path:
    path = tmp_path / "gpubench_machines.yaml"
    path.write_text(textwrap.dedent(MATRIX.format(cloud=cloud, models=models, provider=provider,
                                                  hosts=f"hosts: {hosts}" if hosts else "")))
    return path


def leases(tmp_path: Path) -> list[dict]:
    return list(sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["gpu_leases"].rows)


def assert_no_gpu_held_twice_at_once(rows: list[dict]) -> None:
    by_gpu: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for row in rows:
        end = row["released_at"] if row["released_at"] is not None else row["expires_at"]
        by_gpu.setdefault((row["machine"], row["gpu_index"]), []).append((row["acquired_at"], end))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end, f"GPU {gpu} was leased twice at once: {spans}"


def answers(port: int) -> bool:
    """Something listens on loopback ``port``."""
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def two_hosts(tmp_path) -> SandboxHostsThread:
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("lab1"), HostPlan("lab2")])
    machines.start()
    yield machines
    machines.stop()


def real_sshd() -> str:
    """``openssh`` where OpenSSH's sshd can serve the hosts (CI requires it), else the sandbox's asyncssh."""
    import shutil

    if (shutil.which("sshd") or os.access("/usr/sbin/sshd", os.X_OK)) and os.geteuid() == 0:
        return "openssh"
    if os.environ.get("GPUBENCH_REQUIRE_SSHD") == "1":
        pytest.fail("GPUBENCH_REQUIRE_SSHD=1 but OpenSSH's sshd cannot run here (installed, as root)", pytrace=False)
    return "asyncssh"


@pytest.fixture
def two_sshd_hosts(tmp_path) -> SandboxHostsThread:
    """Two one-GPU hosts, each a real ``sshd`` on loopback where OpenSSH is installed."""
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("lab1"), HostPlan("lab2")],
                                  ssh_server=real_sshd())
    machines.start()
    yield machines
    machines.stop()


@pytest.mark.slow
def test_three_cells_on_two_hosts_with_two_workers_never_share_a_gpu(tmp_path, two_sshd_hosts):
    two_hosts = two_sshd_hosts
    inventory = two_hosts.hosts.inventory
    matrix = write_matrix(tmp_path, cloud="hosts", models="qwen2:1.5b, qwen2:7b, llama3:8b",
                          hosts=str(inventory.relative_to(tmp_path)))
    known_hosts = tmp_path / "gpubench_known_hosts"
    done = run_pytest(tmp_path, str(matrix), "-n", "2", "-W", "default", "--gpubench-known-hosts", str(known_hosts))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    rows = manifest_rows(tmp_path)
    assert len(rows) == 3 and {row["status"] for row in rows} == {"success"}
    assert {row["provider"] for row in rows} == {"hosts"}
    held = leases(tmp_path)
    assert len(held) == 3 and all(row["released_at"] is not None for row in held)
    assert_no_gpu_held_twice_at_once(held)
    # The busy machine is passed over for the idle one: with two one-GPU machines and two workers,
    # no cell ever waits for a GPU. (Whether two cells overlap at all is the scheduler's timing:
    # on a loaded machine one worker may run all three one after another, on one machine.)
    ports = {str(m.ssh_port) for m in two_hosts.hosts.machines.values()}
    assert {row["machine"].rpartition(":")[2] for row in held} <= ports
    logs = list((tmp_path / "reports" / "progress").rglob("*.log"))
    assert len(logs) == 3 and not any("status=waiting_for_gpu" in log.read_text() for log in logs)
    assert {str(row["ssh_port"]) for row in rows} <= ports
    # Each attempt names the machine its cell ran on, also when the one first chosen was taken meanwhile.
    port_of = {name: str(m.ssh_port) for name, m in two_hosts.hosts.machines.items()}
    attempts = list(sqlite_utils.Database(tmp_path / "reports" / "manifest.db")["attempts"].rows)
    ran_on = {row["id"]: str(row["ssh_port"]) for row in rows}
    assert len(attempts) == 3 and all(port_of[a["machine_id"]] == ran_on[a["manifest_id"]] for a in attempts)
    # Their keys were in no known_hosts file: pinned on first use, and said so.
    pinned = known_hosts.read_text().splitlines()
    assert {line.split()[0] for line in pinned} == {host_pattern("127.0.0.1", int(port)) for port in ports}
    assert "trusted on first use and pinned" in done.stdout
    # Left as found: the Ollama servers the cells started are stopped.
    for machine in two_hosts.hosts.machines.values():
        assert not answers(machine.ollama_port)


@pytest.mark.slow
def test_the_local_provider_benchmarks_this_machine(tmp_path):
    machine = local_machine(tmp_path, "RTX 4090", 1)
    # This machine, given the stand-in nvidia-smi and Ollama (its GPU is the stand-in's).
    here = {name: machine.environment()[name] for name in ("PATH", "OLLAMA_HOST", "GPUBENCH_SANDBOX_INSTANCE")}
    here["HOME"] = str(tmp_path / "home")  # the local provider's persistent home goes under it, not the user's
    (tmp_path / "hosts.yaml").write_text("local: {price_per_hour: 0.5}\n")
    matrix = write_matrix(tmp_path, cloud="local", provider="local", models="qwen2:1.5b", hosts="hosts.yaml")
    done = run_pytest(tmp_path, str(matrix), extra_env=here)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "success" and row["price_per_hour"] == 0.5, done.stdout[-3000:]
    (lease,) = leases(tmp_path)
    assert lease["machine"].startswith("local:") and lease["released_at"] is not None
    assert not answers(int(machine.environment()["OLLAMA_HOST"].rpartition(":")[2]))
    assert (tmp_path / "home" / ".gpubench" / "local-home").is_dir()  # kept: the next cell finds its caches


@pytest.fixture(params=["asyncssh", "openssh"])
def one_host(request, tmp_path) -> SandboxHostsThread:
    """One sandbox host behind each SSH server the sandbox has (OpenSSH's sshd when installed)."""
    if request.param == "openssh":
        from pytest_gpubench.sandbox.sshd import find_sshd

        if find_sshd() is None:
            pytest.skip("OpenSSH's sshd is not installed")
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("lab1")], ssh_server=request.param)
    machines.start()
    yield machines
    machines.stop()


def test_host_keys_are_pinned_on_first_use_checked_after_and_a_changed_one_refused(tmp_path, one_host):
    lab1 = one_host.hosts.machines["lab1"]
    key = one_host.hosts.key_file.read_text()
    pin_file = tmp_path / "pins" / "known_hosts"
    told: list[str] = []

    def login(known: tuple[str, ...] = ()) -> str:
        async def go() -> str:
            conn = await connect_checked("127.0.0.1", lab1.ssh_port, "root", key, known_hosts=known,
                                         pin_file=str(pin_file), timeout=20,
                                         on_pinned=lambda fingerprint, _: told.append(fingerprint))
            try:
                return conn.host_key_fingerprint
            finally:
                await conn.close()
        return run_async(go(), 60)

    first = login()
    assert told == [first] and first in pinned_fingerprints(pin_file)
    assert (pin_file.stat().st_mode & 0o777) == 0o600
    assert login() == first and told == [first]  # known now: checked, not pinned again
    # The machine's key changes (reinstalled, or someone in between): refused, naming both keys.
    other = __import__("asyncssh").generate_private_key("ssh-ed25519")
    stale = tmp_path / "inventory_known_hosts"
    stale.write_text(f"{host_pattern('127.0.0.1', lab1.ssh_port)} "
                     f"{other.export_public_key('openssh').decode().strip()}\n")
    with pytest.raises(HostKeyChanged) as refused:
        login((str(stale),))
    message = str(refused.value)
    assert refused.value.stage == Stage.SSH_CONNECT
    assert other.get_fingerprint() in message and first in message and str(stale) in message


def test_a_revoked_host_key_is_refused_and_a_host_known_by_its_ca_is_not_pinned(tmp_path, one_host):
    """``@revoked`` and ``@cert-authority`` lines count: a revoked key is refused even where it would be
    pinned on first use, and a host its known_hosts name a CA for is checked against that CA (this
    sandbox host presents no certificate: refused), never trusted on first use."""
    import asyncssh

    from pytest_gpubench.errors import StageError

    lab1 = one_host.hosts.machines["lab1"]
    key = one_host.hosts.key_file.read_text()
    pattern = host_pattern("127.0.0.1", lab1.ssh_port)

    def login(known: Path, pin_file: Path) -> None:
        async def go() -> None:
            conn = await connect_checked("127.0.0.1", lab1.ssh_port, "root", key, known_hosts=(str(known),),
                                         pin_file=str(pin_file), timeout=20)
            await conn.close()
        run_async(go(), 60)

    learned = tmp_path / "learned"
    login(tmp_path / "none", learned)
    host_key = learned.read_text().split(None, 1)[1]
    revoked = tmp_path / "revoked_known_hosts"
    revoked.write_text(f"@revoked {pattern} {host_key}")
    with pytest.raises(StageError, match="is marked @revoked") as refused:
        login(revoked, tmp_path / "pins_r")
    assert refused.value.stage is Stage.SSH_CONNECT and not (tmp_path / "pins_r").exists()
    ca = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    by_ca = tmp_path / "ca_known_hosts"
    by_ca.write_text(f"@cert-authority {pattern} {ca}\n")
    # asyncssh's server says so; OpenSSH's, offered only certificate algorithms, ends the connection.
    with pytest.raises(StageError, match="not certified by the CA|cannot open SSH") as uncertified:
        login(by_ca, tmp_path / "pins_ca")
    assert uncertified.value.stage is Stage.SSH_CONNECT and not (tmp_path / "pins_ca").exists()


def test_strict_host_keys_refuse_a_host_in_no_known_hosts_file_and_pin_nothing(tmp_path):
    """Issue 21 item 7: ``--gpubench-host-keys strict`` fails ``ssh_connect`` on an unknown host key,
    naming the key presented, instead of pinning it; a key already pinned (or listed) still connects."""
    from pytest_gpubench.cloud.hosts_provider import HostsProvider
    from pytest_gpubench.errors import StageError
    from pytest_gpubench.settings import Settings

    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("lab1")])
    machines.start()
    try:
        pin_file = tmp_path / "pins" / "known_hosts"

        def login(policy: str) -> str:
            settings = Settings(hosts=str(machines.hosts.inventory), known_hosts=str(pin_file), host_keys=policy)
            (machine,) = HostsProvider(settings).machines(None)
            ssh = HostsProvider(settings).ssh_for(machine, (0,))

            async def go() -> str:
                conn = await connect_checked(ssh.host, ssh.port, ssh.user, ssh.private_key, known_hosts=ssh.known_hosts,
                                             pin_file=ssh.pin_file, timeout=20, key_path=ssh.key_file)
                try:
                    return conn.host_key_fingerprint
                finally:
                    await conn.close()
            return run_async(go(), 60)

        with pytest.raises(StageError) as refused:
            login("strict")
        message = str(refused.value)
        assert refused.value.stage is Stage.SSH_CONNECT and "--gpubench-host-keys is strict" in message
        assert "SHA256:" in message and str(pin_file) in message and not pin_file.exists()
        first = login("pin")  # the default: trusted on first use and pinned
        assert first in pinned_fingerprints(pin_file) and first in message
        assert login("strict") == first  # known now (gpubench's own file is still read): connects
    finally:
        machines.stop()


def pinned_fingerprints(path: Path) -> str:
    import asyncssh

    return " ".join(asyncssh.import_public_key(" ".join(line.split()[1:])).get_fingerprint()
                    for line in path.read_text().splitlines())


@pytest.mark.slow
def test_a_server_already_running_is_used_and_left_running_and_pulled_models_go_when_asked(tmp_path):
    """Leave a host as found: the Ollama server that was running serves the cell and runs on after
    it; ``keep_models: false`` removes the model the cell pulled (and only that one)."""
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("lab1", ollama=True)],
                                  inventory_extra={"lab1": {"keep_models": False}})
    machines.start()
    try:
        lab1 = machines.hosts.machines["lab1"]
        machines.run(lab1._run_logged("nohup ollama serve >/dev/null 2>&1 &", lab1.home / "serve.log"))
        wait_until_answers(lab1.ollama_port)
        matrix = write_matrix(tmp_path, cloud="hosts", provider="lab1", models="qwen2:1.5b",
                              hosts=str(machines.hosts.inventory))
        done = run_pytest(tmp_path, str(matrix), "--gpubench-known-hosts", str(tmp_path / "kh"))
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert answers(lab1.ollama_port)  # the server found running still runs
        tags = __import__("httpx").get(f"http://127.0.0.1:{lab1.ollama_port}/api/tags", timeout=10).json()
        assert [m["name"] for m in tags.get("models", [])] == []  # the model this cell pulled is gone
        log = next((tmp_path / "reports" / "progress").rglob("*.log")).read_text()
        (left,) = [line for line in log.splitlines() if "LEFT_AS_FOUND" in line]
        assert "removed qwen2:1.5b" in left and "stopped" not in left
    finally:
        machines.stop()


def test_a_server_a_dead_run_left_is_ended_not_adopted(tmp_path):
    """An ``ollama serve`` gpubench started (its pid file) that no cell holds is a dead run's: the
    next cell restarts it with its own settings and stops it at the end, leaving nothing running."""
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("lab1", ollama=True)])
    machines.start()
    try:
        lab1 = machines.hosts.machines["lab1"]
        left = 'mkdir -p "$HOME/.gpubench"; nohup ollama serve >/dev/null 2>&1 & echo $! > "$HOME/.gpubench/ollama-serve.pid"'
        machines.run(lab1._run_logged(left, lab1.home / "serve.log"))
        wait_until_answers(lab1.ollama_port)
        matrix = write_matrix(tmp_path, cloud="hosts", provider="lab1", models="qwen2:1.5b",
                              hosts=str(machines.hosts.inventory))
        done = run_pytest(tmp_path, str(matrix), "--gpubench-known-hosts", str(tmp_path / "kh"))
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert not answers(lab1.ollama_port)  # neither the dead run's server nor the cell's runs on
        log = next((tmp_path / "reports" / "progress").rglob("*.log")).read_text()
        (line,) = [line for line in log.splitlines() if "LEFT_AS_FOUND" in line]
        assert "stopped" in line
    finally:
        machines.stop()


def wait_until_answers(port: int) -> None:
    deadline = time.monotonic() + 60
    while not answers(port):
        assert time.monotonic() < deadline, f"nothing answers on {port}"
        time.sleep(0.1)


def test_gpubench_sandbox_hosts_starts_machines_and_writes_their_inventory(tmp_path):
    import subprocess
    import sys

    from pytest_gpubench.cloud.hosts_inventory import load_inventory

    process = subprocess.Popen(
        [sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "hosts", "lab1=RTX 4090*2", "lab2",
         "--dir", str(tmp_path / "m"), "--exit-with-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("GPUBENCH_HOSTS="), line + process.stderr.read()
        inventory = load_inventory(line.split("=", 1)[1].strip())
        assert {name: (h.gpu, h.gpus) for name, h in inventory.hosts.items()} == {
            "lab1": ("RTX 4090", 2), "lab2": ("RTX 4090", 1)}
        assert all(answers(h.port) for h in inventory.hosts.values())  # their SSH servers listen
    finally:
        process.stdin.close()
        assert process.wait(60) == 0


def test_a_cell_on_a_host_whose_key_changed_fails_at_ssh_connect_naming_both_keys(tmp_path, two_hosts):
    import asyncssh
    import yaml

    lab1 = two_hosts.hosts.machines["lab1"]
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    known = tmp_path / "lab_known_hosts"
    known.write_text(f"{host_pattern('127.0.0.1', lab1.ssh_port)} "
                     f"{impostor.export_public_key('openssh').decode().strip()}\n")
    inventory = two_hosts.hosts.inventory
    data = yaml.safe_load(inventory.read_text())
    data["hosts"]["lab1"]["known_hosts"] = str(known)
    inventory.write_text(yaml.safe_dump(data))
    matrix = write_matrix(tmp_path, cloud="hosts", provider="lab1", models="qwen2:1.5b", hosts=str(inventory))
    done = run_pytest(tmp_path, str(matrix), "--gpubench-known-hosts", str(tmp_path / "kh"))
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "failed" and row["failure_stage"] == "ssh_connect"
    assert impostor.get_fingerprint() in row["error_message"] and str(known) in row["error_message"]
    assert "now the server presents SHA256:" in row["error_message"]
    assert not (tmp_path / "kh").exists()  # a known host is checked, never pinned over
    assert all(lease["released_at"] is not None for lease in leases(tmp_path))


@pytest.mark.slow
def test_a_cell_that_fails_after_starting_the_server_still_stops_it(tmp_path, two_hosts):
    matrix = write_matrix(tmp_path, cloud="hosts", provider="lab1", models="nosuchmodel:1b",
                          hosts=str(two_hosts.hosts.inventory))
    done = run_pytest(tmp_path, str(matrix), "--gpubench-known-hosts", str(tmp_path / "kh"))
    (row,) = manifest_rows(tmp_path)
    assert row["status"] == "failed" and row["failure_stage"] == "model_pull", done.stdout[-3000:]
    assert not answers(two_hosts.hosts.machines["lab1"].ollama_port)


@pytest.mark.slow
def test_two_vllm_cells_share_a_two_gpu_host_one_gpu_and_one_server_each(tmp_path):
    """A server of its own per cell (vLLM starts one per cell on a free port): a 2-GPU host takes two
    1-GPU cells, each leasing one GPU; no GPU is held twice at once, and no server stays behind."""
    machines = SandboxHostsThread(tmp_path / "machines", [HostPlan("duo", gpus=2)])
    machines.start()
    try:
        path = tmp_path / "gpubench_duo.yaml"
        path.write_text(textwrap.dedent(f"""\
            cloud: hosts
            hosts: {machines.hosts.inventory}
            workload: {{duration: 3s, max_tokens: 32, warmup_requests: 1}}
            matrix:
              - {{gpu: RTX 4090, provider: duo, models: [qwen2:1.5b, qwen2:7b], runtime: vllm}}
            """))
        # Each cell, once its GPU is leased, waits for the other's lease: both run at once, or the
        # run fails (a provider giving both cells GPU 0 one after the other could not pass). A cell
        # requests its fixtures in its body, so the barrier first sets up its session (the lease, at
        # create) as the body would; waiting before that, no cell had leased and each waited the bound out.
        (tmp_path / "both_at_once.py").write_text(textwrap.dedent(f"""\
            import sqlite3, time
            import pytest

            @pytest.hookimpl(wrapper=True)
            def pytest_runtest_call(item):
                item.funcargs["request"].getfixturevalue("gpu_session")
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    with sqlite3.connect({str(tmp_path / "reports" / "manifest.db")!r}, timeout=30) as db:
                        held = db.execute("SELECT COUNT(*) FROM gpu_leases WHERE released_at IS NULL").fetchone()
                    if held[0] >= 2:
                        break
                    time.sleep(0.1)
                return (yield)
            """))
        here = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        done = run_pytest(tmp_path, str(path), "-n", "2", "-p", "both_at_once", "--gpubench-known-hosts",
                          str(tmp_path / "kh"), extra_env=here)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        rows = manifest_rows(tmp_path)
        assert {row["status"] for row in rows} == {"success"} and len(rows) == 2
        held = leases(tmp_path)
        assert len(held) == 2 and all(row["released_at"] is not None for row in held)
        assert_no_gpu_held_twice_at_once(held)
        # Two GPUs, held at the same time: the cells shared the host, not took turns on one GPU.
        assert {row["gpu_index"] for row in held} == {0, 1}
        first, second = sorted(held, key=lambda row: row["acquired_at"])
        assert second["acquired_at"] < first["released_at"]
        home = machines.hosts.machines["duo"].home / ".gpubench"
        logs = [p.read_text() for p in (tmp_path / "reports" / "progress").rglob("*.log")]
        assert all("stopped the vllm server it started" in log for log in logs)
        # Each server had files of its own (named by its GPUs); none is left running.
        assert {p.name for p in home.glob("vllm-serve*.log")} <= {"vllm-serve-gpu0.log", "vllm-serve-gpu1.log"}
        assert list(home.glob("vllm-serve*.pid")) == []
    finally:
        machines.stop()


def test_gpubench_sandbox_local_gives_a_shell_the_stand_in_gpus(tmp_path):
    import os
    import shlex
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "pytest_gpubench.commands.cli", "sandbox", "local", "RTX 4090*2",
         "--dir", str(tmp_path), "--exit-with-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        exports = [process.stdout.readline() for _ in range(4)]
        assert all(line.startswith("export ") for line in exports), exports
        environment = dict(os.environ)
        for line in exports:
            name, _, value = line.removeprefix("export ").strip().partition("=")
            environment[name] = shlex.split(value)[0]
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"], env=environment,
                                capture_output=True, text=True, timeout=60)
        assert listed.stdout.splitlines() == ["0, NVIDIA GeForce RTX 4090", "1, NVIDIA GeForce RTX 4090"]
    finally:
        process.stdin.close()
        assert process.wait(60) == 0


@pytest.mark.slow
def test_a_cell_waits_with_progress_for_a_gpu_a_dead_run_held_until_its_lease_runs_out(tmp_path, two_hosts):
    from pytest_gpubench.store.sqlite_store import SqliteStore

    import threading

    lab1 = two_hosts.hosts.machines["lab1"]
    progress = tmp_path / "reports" / "progress"

    def waiting() -> bool:
        return any("status=waiting_for_gpu" in log.read_text() for log in progress.rglob("*.log"))

    with SqliteStore.open(tmp_path / "reports" / "manifest.db") as store:
        # Another run holds GPU 0, renewing its lease, until the cell says it waits; then it dies
        # (stops renewing) and its lease runs out 4 s later: no race with how long pytest takes to start.
        other = store.claim_gpus(f"127.0.0.1:{lab1.ssh_port}", [0], 1, holder="dead-run/cell", ttl=4.0)
        matrix = write_matrix(tmp_path, cloud="hosts", provider="lab1", models="qwen2:1.5b",
                              hosts=str(two_hosts.hosts.inventory))
        finished: dict = {}
        run = threading.Thread(target=lambda: finished.update(done=run_pytest(
            tmp_path, str(matrix), "--gpubench-known-hosts", str(tmp_path / "kh"))))
        run.start()
        deadline = time.monotonic() + 120
        while not waiting() and run.is_alive() and time.monotonic() < deadline:
            assert store.renew_gpu_lease(other.lease_id, 4.0)
            time.sleep(0.5)
        run.join(300)
    done = finished["done"]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert waiting()  # said while it waited
    held = leases(tmp_path)
    (dead,) = [row for row in held if row["lease_id"] == other.lease_id]
    (taken,) = [row for row in held if row["lease_id"] != other.lease_id]
    assert taken["acquired_at"] >= dead["expires_at"]  # only once the dead run's lease had run out
