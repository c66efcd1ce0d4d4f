"""The stand-ins' answering service: one-shot calls on an instance start no Python and
answer the same bytes, stderr and exit status as the stand-in modules.

Every call runs over real SSH on a sandbox instance, with asyncssh's server and with
OpenSSH's ``sshd`` (skipped without one, as in test_sandbox_openssh.py). Interpreter
starts are counted by a probe: a ``sitecustomize`` on ``PYTHONPATH`` that every Python
started by a wrapper imports, appending a line to a log.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest
from polling import wait_for
from e2e_helpers import SANDBOX_AUTH

from pytest_gpubench.sandbox import SandboxThread, shims, standin_service
from pytest_gpubench.sandbox.standin_answer import Answer

TIME_SCALE = 0.01
PREINSTALLED_4090 = "vastai-18430201"
MODULES = {
    "nvidia-smi": shims.NVIDIA_SMI_MODULE,
    "df": shims.DF_MODULE,
    "ollama": shims.OLLAMA_MODULE,
    "curl": f'{shims.SHIMS_MODULE} curl "$(dirname "$(command -v curl)")"',
}
#: (environment prefix, program, arguments as shell text): answers that do not move with time.
ONE_SHOT_CASES = [
    ("", "nvidia-smi", "--query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits"),
    ("", "nvidia-smi", "--query-gpu=compute_cap --format=csv,noheader,nounits"),
    ("", "nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,memory.used,pstate,count --format=csv"),
    ("", "nvidia-smi", "-L"),
    ("", "nvidia-smi", "--query-gpu='na me,it'\\''s $(x)' --format=csv"),
    ("", "nvidia-smi", "--bogus"),
    ("", "nvidia-smi", "-i 7 -L"),
    ("GPUBENCH_SANDBOX_SMI_NA=memory.total,power.draw", "nvidia-smi", "--query-gpu=memory.total,name --format=csv"),
    ("GPUBENCH_SANDBOX_SMI_FAULT=driver", "nvidia-smi", "-q"),
    ("GPUBENCH_SANDBOX_INSTANCE=", "nvidia-smi", "-L"),
    ("", "df", "-Pk"),
    ("", "df", '-h . "$HOME"'),
    ("", "df", "-P \"/no such/it's \\$(x)\" / 'a\nb'"),
    ("", "df", "--bogus"),
    ("", "df", "--version"),
    ("", "ollama", "--version"),
    ("OLLAMA_HOST=127.0.0.1:9", "ollama", "-v"),
    ("", "ollama", ""),
    ("", "ollama", "bogus"),
    ("", "curl", "-fsSL https://ollama.com/install.sh"),
]
SITECUSTOMIZE = (
    "import os\n"
    "if os.environ.get('GPUBENCH_PROBE_LOG'):\n"
    "    with open(os.environ['GPUBENCH_PROBE_LOG'], 'a') as log:\n"
    "        log.write(f'{os.getpid()}\\n')\n"
)


def _openssh_missing() -> str:
    if not (shutil.which("sshd") or os.access("/usr/sbin/sshd", os.X_OK)):
        return "no OpenSSH sshd on this machine"
    return "" if os.geteuid() == 0 else "sshd logs in root only when it runs as root"


@pytest.fixture(scope="module", params=["asyncssh", "openssh"])
def instance(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A running session with Ollama preinstalled: (session, key, instance root, probe log)."""
    if request.param == "openssh" and _openssh_missing():
        pytest.skip(_openssh_missing())
    with SandboxThread(time_scale=TIME_SCALE, ssh_server=request.param) as sandbox, \
            httpx.Client(base_url=sandbox.url, headers=SANDBOX_AUTH, timeout=30) as api:
        body = {"consumer_id": f"test-{uuid.uuid4().hex[:8]}", "offer_id": PREINSTALLED_4090,
                "workload_type": "interactive", "reservation_hours": 1}
        created = api.post("/api/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id = created.json()["session"]["id"]
        session = wait_for(lambda: (s := api.get(f"/api/v1/sessions/{session_id}").json())["status"] == "running"
                           and s, 30, "the session to run")
        state = next(s for s in api.get("/sandbox/state").json()["sessions"] if s["id"] == session_id)
        probe = tmp_path_factory.mktemp("probe")
        (probe / "sitecustomize.py").write_text(SITECUSTOMIZE)
        yield session, created.json()["ssh_private_key"], Path(state["instance_dir"]), probe


def run(instance: Any, command: str) -> tuple[str, str, int]:
    """``command`` over SSH on the instance: (stdout, stderr, exit status)."""
    session, key, _root, _probe = instance

    async def go() -> asyncssh.SSHCompletedProcess:
        async with asyncssh.connect(session["ssh_host"], session["ssh_port"], username="root",
                                    client_keys=[asyncssh.import_private_key(key)], known_hosts=None,
                                    agent_path=None, config=[]) as conn:
            return await conn.run(command, check=False)

    done = asyncio.run(go())
    return str(done.stdout), str(done.stderr), int(done.exit_status)


def probed(instance: Any, line: str) -> str:
    """``line`` with the interpreter-start probe on PYTHONPATH."""
    probe = instance[3]
    return f"PYTHONPATH={shlex.quote(str(probe))} GPUBENCH_PROBE_LOG={shlex.quote(str(probe / 'starts'))} {line}"


def python_starts(instance: Any) -> int:
    log = instance[3] / "starts"
    return len(log.read_text().splitlines()) if log.exists() else 0


def module_line(env: str, program: str, args: str) -> str:
    """The same call, made to the stand-in module with Python, as the wrappers did before."""
    python = shlex.quote(sys.executable)  # the interpreter the wrappers name
    return f"{env} PYTHONPATH={shlex.quote(str(shims.PACKAGE_ROOT))} {python} -m {MODULES[program]} {args}"


def test_one_shot_calls_start_no_python_and_answer_as_the_modules_do(instance):
    before = python_starts(instance)
    answers = {(env, program, args): run(instance, probed(instance, f"{env} {program} {args}"))
               for env, program, args in ONE_SHOT_CASES}
    assert python_starts(instance) == before, "a one-shot stand-in call started Python"
    for (env, program, args), answer in answers.items():
        assert answer == run(instance, module_line(env, program, args)), f"{env} {program} {args}"
    assert answers[("", "df", "--bogus")][2] == 1 and answers[("", "nvidia-smi", "--bogus")][2] == 2
    weird = answers[("", "df", "-P \"/no such/it's \\$(x)\" / 'a\nb'")]
    assert weird[1] == "df: /no such/it's $(x): No such file or directory\ndf: a\nb: No such file or directory\n"


def test_ollama_version_asks_the_running_server(instance):
    started = run(instance, 'nohup ollama serve > "$HOME/serve.log" 2>&1 < /dev/null & echo $!')
    assert started[2] == 0, started
    wait_for(lambda: "ollama version is" in run(instance, "ollama --version")[0], what="ollama serve to answer")
    before = python_starts(instance)
    answer = run(instance, probed(instance, "ollama --version"))
    assert python_starts(instance) == before
    assert answer == run(instance, module_line("", "ollama", "--version"))
    assert answer[0].startswith("ollama version is ") and "Warning" not in answer[0]
    run(instance, f"kill {int(started[0])}")


def test_calls_the_service_declines_run_the_module(instance):
    """A loop, a client command, another time zone: Python, and the module's answer."""
    before = python_starts(instance)
    looped = run(instance, probed(instance, "timeout 5 nvidia-smi --query-gpu=index --format=csv -lms 50 | head -n 2"))
    assert looped[0] == "index\n0\n"
    assert run(instance, probed(instance, "TZ=Asia/Tokyo nvidia-smi -L"))[0].startswith("GPU 0: ")
    assert run(instance, probed(instance, "ollama list 2>&1 || true")) == run(
        instance, module_line("", "ollama", "list 2>&1 || true"))
    assert python_starts(instance) == before + 3


def test_without_the_service_the_wrappers_fall_back_to_python(instance):
    root = instance[2]
    socket = shims.socket_path_for(root / "bin")
    line = "nvidia-smi --query-gpu=name,memory.total --format=csv"
    expected = run(instance, line)
    aside = socket.with_name("moved-away")
    socket.rename(aside)
    try:
        before = python_starts(instance)
        assert run(instance, probed(instance, line)) == expected
        assert python_starts(instance) == before + 1
    finally:
        aside.rename(socket)


def test_curl_shim_passes_other_urls_to_the_real_curl_without_python(instance):
    before = python_starts(instance)
    out, _err, status = run(instance, probed(instance, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9/ ; echo \" $?\""))
    assert (out, status) == ("000 7\n", 0)
    assert python_starts(instance) == before


def test_socket_is_private(instance):
    socket = shims.socket_path_for(instance[2] / "bin")
    assert socket.is_socket() and socket.parent.stat().st_mode & 0o777 == 0o700


def test_replayed_answers_are_exact_for_any_text():
    tricky = "it's \"$(x)\" `y` \\ $HOME\n\ttab\n\n%s %d\nü€\n"
    for answer in (Answer(stdout=tricky, stderr=tricky[::-1], status=3), Answer(), Answer(stdout="no newline")):
        done = subprocess.run(["sh", "-c", 'eval "$1"', "sh", standin_service.shell_replay(answer)],
                              capture_output=True, check=False)
        assert (done.stdout.decode(), done.stderr.decode(), done.returncode) == (
            answer.stdout, answer.stderr, answer.status)


def test_the_service_declines_what_it_cannot_answer_exactly(tmp_path):
    service = standin_service.StandinService(tmp_path / "instance.json", tmp_path / "bin")
    mine = str(tmp_path / "instance.json")
    for program, instance, env in [
        ("nvidia-smi", str(tmp_path / "other.json"), {}),  # another instance's file
        ("nvidia-smi", mine, {"PATH": "/usr/bin"}),  # a variable its wrapper does not send
        ("nvidia-smi", mine, {"TZ": "Asia/Tokyo" if os.environ.get("TZ") != "Asia/Tokyo" else "UTC"}),
        ("python3", mine, {}),  # not a stand-in
    ]:
        with pytest.raises(standin_service.Declined):
            asyncio.run(service.answer(program, ["-L"], instance, env, None))


def test_long_instance_paths_put_the_socket_in_a_private_tmp_directory(tmp_path):
    bin_dir = tmp_path / ("x" * 120) / "bin"
    socket = shims.socket_path_for(bin_dir)
    assert socket.parent.parent == Path("/tmp") and len(str(socket)) <= 100
    assert shims.socket_path_for(bin_dir) == socket  # the curl shim finds it again from its argument
    assert shims.socket_path_for(tmp_path / "bin") == tmp_path / "run" / shims.SOCKET_NAME
    fresh = tmp_path / "fresh"
    assert standin_service.private_directory(fresh) and fresh.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    assert not standin_service.private_directory(shared)  # e.g. someone else's /tmp name: the service stays off
