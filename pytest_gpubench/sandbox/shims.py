"""The small programs in a sandbox instance's ``bin/``, and the ``curl`` shim itself.

Each stand-in (``nvidia-smi``, ``ollama``, ``df``) is a small ``sh`` wrapper. Given the
instance's answering-service socket (:mod:`.standin_service`), it first asks that
service with the host's real ``curl --unix-socket``, which answers one-shot calls
without starting Python; a call the service declines, or a sandbox that is gone, runs
the stand-in module with the sandbox's own Python, so the instance needs nothing
installed. ``curl`` is a wrapper too: for exactly ``https://ollama.com/install.sh``
it answers an install script that, piped to ``sh``, takes the (time-scaled) install
time and writes the ``ollama`` wrapper into ``bin/``; any other URL goes to the real
``curl``, found on ``PATH`` by the wrapper itself. So the real default install
command works unchanged on an instance::

    curl -fsSL https://ollama.com/install.sh | sh

Run as ``python -m pytest_gpubench.sandbox.shims curl BIN_DIR ARGS...``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from ..runtime_facts import SandboxImitation, all_facts
from .standin_answer import Answer

INSTALL_URL = "https://ollama.com/install.sh"
INSTANCE_ENV = "GPUBENCH_SANDBOX_INSTANCE"
# The directory that holds the pytest_gpubench package: wrappers put it on
# PYTHONPATH so the stand-ins import even when the package is not installed.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SOCKET_NAME = "standin.sock"
#: A Unix socket path must fit ``sun_path`` (108 bytes on Linux, 104 on macOS).
_MAX_SOCKET_PATH = 100
#: What each wrapper tells the service of its environment (when set). TZ for all:
#: answers with a timestamp are local time, which the service only gives in its own zone.
FORWARDED_ENV: dict[str, tuple[str, ...]] = {
    "nvidia-smi": ("TZ", "GPUBENCH_SANDBOX_SMI_NA", "GPUBENCH_SANDBOX_SMI_FAULT"),
    "ollama": ("TZ", "OLLAMA_HOST"),
    "df": ("TZ",),
    "curl": ("TZ",),
}
#: Programs that also send their working directory (``df PATH`` looks PATH up there).
SENDS_CWD = frozenset({"df"})
NVIDIA_SMI_MODULE = "pytest_gpubench.sandbox.nvidia_smi_standin"
OLLAMA_MODULE = "pytest_gpubench.sandbox.ollama_standin"
DF_MODULE = "pytest_gpubench.sandbox.df_standin"
SHIMS_MODULE = "pytest_gpubench.sandbox.shims"
LAUNCHERS_MODULE = "pytest_gpubench.sandbox.openai_launchers"
#: ``docker``: images, pulls and seed-004 worker containers (:mod:`.docker_standin`).
DOCKER_MODULE = "pytest_gpubench.sandbox.docker_standin"
#: SGLang is started as ``python3 -m sglang.launch_server``: a package, not a program in ``bin/``.
SGLANG_PACKAGE = "sglang"


def imitations() -> list[SandboxImitation]:
    """How the sandbox imitates each runtime on an instance: each runtime's declaration says it
    (``RuntimeFacts.sandbox``), built-in and registered alike; an instance gets every launcher
    (:mod:`.openai_launchers`) and package these name."""
    return [facts.sandbox for facts in all_facts() if facts.sandbox is not None]


def socket_path_for(bin_dir: Path) -> Path:
    """The answering service's socket of the instance whose ``bin/`` is ``bin_dir``:
    ``<instance>/run/standin.sock``, or, when that path is too long for a socket, one
    under ``/tmp`` named after ``bin_dir`` (so the ``curl`` shim finds it from its argument)."""
    beside = bin_dir.parent / "run" / SOCKET_NAME
    if len(os.fsencode(beside)) <= _MAX_SOCKET_PATH:
        return beside
    digest = hashlib.sha256(os.fsencode(bin_dir)).hexdigest()[:16]
    return Path("/tmp") / f"gpubench-{digest}" / SOCKET_NAME


def _python_lines(module: str, fixed_args: tuple[str, ...], python: str | None) -> str:
    """The wrapper's tail: run ``python -m <module> [fixed args] "$@"``."""
    python = python or sys.executable
    fixed = "".join(f" {shlex.quote(arg)}" for arg in fixed_args)
    return (
        f'PYTHONPATH={shlex.quote(str(PACKAGE_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n'
        "export PYTHONPATH\n"
        f'exec {shlex.quote(python)} -m {module}{fixed} "$@"\n'
    )


def module_wrapper(module: str, *fixed_args: str, python: str | None = None) -> str:
    """An ``sh`` script that runs ``python -m <module> [fixed args] "$@"``."""
    return "#!/bin/sh\n# gpubench sandbox stand-in (pytest_gpubench.sandbox)\n" + _python_lines(
        module, fixed_args, python
    )


def _ask_service(program: str, socket: Path, curl: str) -> str:
    """``sh`` lines that ask the service about ``program "$@"`` and replay its answer.

    Arguments and variables travel as url-encoded form fields (curl encodes them, so
    no text of the call is ever parsed by a shell); a variable that is unset is not
    sent. A failed ask (no service, a declined call: HTTP 404) falls through.
    """
    env_fields = "".join(
        f' ${{{name}+--data-urlencode}} ${{{name}+"env={name}=${name}"}}' for name in FORWARDED_ENV[program]
    )
    cwd_field = ' --data-urlencode "cwd=$PWD"' if program in SENDS_CWD else ""
    return (
        "gpubench_ask() {\n"
        '  for gpubench_arg do shift; set -- "$@" --data-urlencode "arg=$gpubench_arg"; done\n'
        f"  exec {shlex.quote(curl)} -q -sf --noproxy '*' --unix-socket {shlex.quote(str(socket))} \\\n"
        f'    --data-urlencode "instance=${{{INSTANCE_ENV}-}}"{env_fields}{cwd_field} \\\n'
        f'    "$@" {shlex.quote("http://standin/" + program)}\n'
        "}\n"
        'if gpubench_answer=$(gpubench_ask "$@" 2>/dev/null); then eval "$gpubench_answer"; fi\n'
    )


def host_curl(bin_dir: Path) -> str | None:
    """The real ``curl`` the wrappers talk to the service with: the first on PATH that
    is not the instance's shim, links resolved (so the sandbox and a Python stand-in on
    the instance, whose PATH starts with ``bin/``, name the same one)."""
    found = _real_curl(bin_dir)
    return os.path.realpath(found) if found else None


def service_wrapper(program: str, module: str, *fixed_args: str, bin_dir: Path | None) -> str:
    """``program``'s wrapper for the instance whose ``bin/`` is ``bin_dir``: ask the
    instance's service, else run the module.

    Without ``bin_dir``, or without a real ``curl``, it is the plain :func:`module_wrapper`.
    """
    curl = host_curl(bin_dir) if bin_dir is not None else None
    if bin_dir is None or curl is None:
        return module_wrapper(module, *fixed_args)
    return (
        "#!/bin/sh\n"
        "# gpubench sandbox stand-in (pytest_gpubench.sandbox): the instance's answering\n"
        "# service answers one-shot calls; the calls it declines run the Python module.\n"
        + _ask_service(program, socket_path_for(bin_dir), curl)
        + _python_lines(module, fixed_args, None)
    )


def ollama_wrapper(bin_dir: Path | None = None) -> str:
    """The ``ollama`` command: the other stand-in module of this package."""
    return service_wrapper("ollama", OLLAMA_MODULE, bin_dir=bin_dir)


def nvidia_smi_wrapper(bin_dir: Path | None = None) -> str:
    """The ``nvidia-smi`` command."""
    return service_wrapper("nvidia-smi", NVIDIA_SMI_MODULE, bin_dir=bin_dir)


def df_wrapper(bin_dir: Path | None = None) -> str:
    """The ``df`` command: the instance's emulated disk."""
    return service_wrapper("df", DF_MODULE, bin_dir=bin_dir)


def launcher_wrapper(program: str, stand_in: str | None = None) -> str:
    """``vllm`` or ``llama-server``: always the Python module (each call starts a
    server or answers ``--version``, nothing the answering service would save). A runtime
    imitated by another program's stand-in (``stand_in``) runs it ``--as`` its own name, so
    its server's command line names ``program`` as a real one's would (pid files are checked
    against it, ``runtimes/openai_server.py``)."""
    if stand_in is None or stand_in == program:
        return module_wrapper(LAUNCHERS_MODULE, program)
    return module_wrapper(LAUNCHERS_MODULE, "--as", program, stand_in)


def write_sglang_package(python_dir: Path, name: str = SGLANG_PACKAGE) -> None:
    """An importable ``sglang`` package (named ``name``) in ``python_dir`` (on the instance's ``PYTHONPATH``):
    ``sglang.__version__``, and ``python3 -m sglang.launch_server ARGS`` running the stand-in
    (exec'd, so the pid ``nohup`` reported is the server's)."""
    package = python_dir / name
    package.mkdir(parents=True, exist_ok=True)
    from .openai_launchers import SGLANG_VERSION

    (package / "__init__.py").write_text(
        f'"""gpubench sandbox stand-in for SGLang (pytest_gpubench.sandbox)."""\n__version__ = {SGLANG_VERSION!r}\n',
        encoding="utf-8")
    # The stand-in runs on the sandbox's own interpreter, named here, not on the instance's
    # python3 that started it: that one is the bare interpreter (a symlink outside any virtualenv),
    # without the project's dependencies, as on a fresh cloud instance.
    (package / "launch_server.py").write_text(
        '"""gpubench sandbox stand-in for `python3 -m sglang.launch_server`."""\n'
        "import os\nimport sys\n\n"
        f"os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, [{str(PACKAGE_ROOT)!r}, "
        "os.environ.get('PYTHONPATH')]))\n"
        f"SANDBOX_PYTHON = {sys.executable!r}\n"
        f"os.execv(SANDBOX_PYTHON, [SANDBOX_PYTHON, '-m', {LAUNCHERS_MODULE!r}, 'sglang', *sys.argv[1:]])\n",
        encoding="utf-8")


def curl_wrapper(bin_dir: Path) -> str:
    """The ``curl`` command; it needs its own directory to find the real curl.

    Only exactly the install URL is the shim's (asked of the service, else Python);
    everything else is ``exec``'d from ``sh`` to the first other ``curl`` on ``PATH``,
    as :func:`_real_curl` would choose it, without starting Python.
    """
    curl = host_curl(bin_dir)
    if curl is None:
        return module_wrapper(SHIMS_MODULE, "curl", str(bin_dir))
    own = shlex.quote(str(bin_dir))
    return (
        "#!/bin/sh\n"
        "# gpubench sandbox curl shim (pytest_gpubench.sandbox): the Ollama install URL is\n"
        "# the sandbox's; any other call goes to the real curl.\n"
        "gpubench_urls=0 gpubench_install=\n"
        "for gpubench_arg do\n"
        '  case $gpubench_arg in http://*|https://*)\n'
        "    gpubench_urls=$((gpubench_urls + 1))\n"
        f'    [ "$gpubench_arg" = {shlex.quote(INSTALL_URL)} ] && gpubench_install=1;;\n'
        "  esac\n"
        "done\n"
        'if [ "$gpubench_urls" = 1 ] && [ -n "$gpubench_install" ]; then\n'
        + _ask_service("curl", socket_path_for(bin_dir), curl)
        + _python_lines(SHIMS_MODULE, ("curl", str(bin_dir)), None)
        + "fi\n"
        "set -f; IFS=:\n"
        "for gpubench_dir in ${PATH-}; do\n"
        f'  if [ -z "$gpubench_dir" ] || [ "$gpubench_dir" -ef {own} ]; then continue; fi\n'
        '  if [ -f "$gpubench_dir/curl" ] && [ -x "$gpubench_dir/curl" ]; then exec "$gpubench_dir/curl" "$@"; fi\n'
        "done\n"
        "echo 'curl: command not found' >&2\n"
        "exit 127\n"
    )


def write_executable(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0755, atomically (never half a script)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.chmod(0o755)
    partial.replace(path)


def install_script(bin_dir: Path, install_seconds: float) -> str:
    """What ``curl https://ollama.com/install.sh`` answers on a sandbox instance.

    It talks like the real script (status lines on stderr, no systemd in a
    container so nothing is started), waits ``install_seconds`` (already scaled),
    and installs the ``ollama`` wrapper with an atomic rename.
    """
    target = bin_dir / "ollama"
    partial = shlex.quote(str(target) + ".partial")
    return f"""#!/bin/sh
# This script installs Ollama on Linux. (gpubench sandbox edition)
set -eu
status() {{ echo ">>> $*" >&2; }}
warning() {{ echo "WARNING: $*"; }}
status "Installing ollama to /usr/local"
status "Downloading Linux amd64 bundle"
sleep {max(install_seconds, 0.0):.3f}
cat > {partial} <<'GPUBENCH_SANDBOX_EOF'
{ollama_wrapper(bin_dir)}GPUBENCH_SANDBOX_EOF
chmod 755 {partial}
mv -f {partial} {shlex.quote(str(target))}
status "Creating ollama user..."
status "Adding ollama user to video group..."
status "Adding current user to ollama group..."
warning "systemd is not running"
status "NVIDIA GPU installed."
status 'Install complete. Run "ollama" from the command line.'
"""


def _scaled_install_seconds(environ: Mapping[str, str]) -> float:
    """The install time of this instance, shrunk by its time scale (0 if unknown)."""
    path = environ.get(INSTANCE_ENV)
    if not path:
        return 0.0
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        return float(spec["ollama"]["install_seconds"]) * float(spec.get("time_scale", 1.0))
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _output_target(args: list[str]) -> str | None:
    """Where curl was told to write (``-o FILE``, ``--output FILE``, ``-O``), else None."""
    for index, arg in enumerate(args):
        if arg in ("-o", "--output") and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--output="):
            return arg.split("=", 1)[1]
        if arg == "-O" or arg == "--remote-name":
            return "install.sh"
    return None


def _real_curl(bin_dir: Path) -> str | None:
    """The first ``curl`` on PATH that is not this shim."""
    own = os.path.realpath(bin_dir)
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or os.path.realpath(entry) == own:
            continue
        candidate = os.path.join(entry, "curl")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _asks_install_url(args: list[str]) -> bool:
    return [a for a in args if a.startswith(("http://", "https://"))] == [INSTALL_URL]


def install_answer(bin_dir: Path, args: list[str], environ: Mapping[str, str]) -> Answer | None:
    """What ``curl args`` prints when it asks for exactly the install URL on stdout,
    else None (another URL, or ``-o FILE``: only a process on the instance does those)."""
    if not _asks_install_url(args) or _output_target(args) is not None:
        return None
    return Answer(stdout=install_script(bin_dir, _scaled_install_seconds(environ)))


def curl_main(bin_dir: Path, args: list[str]) -> int:
    """Answer the Ollama install URL here; hand anything else to the real curl."""
    if _asks_install_url(args):
        answer = install_answer(bin_dir, args, os.environ)
        if answer is not None:
            return answer.emit()
        target = _output_target(args)
        assert target is not None
        Path(target).write_text(install_script(bin_dir, _scaled_install_seconds(os.environ)), encoding="utf-8")
        return 0
    real = _real_curl(bin_dir)
    if real is None:
        print("curl: command not found", file=sys.stderr)
        return 127
    os.execv(real, ["curl", *args])
    return 127  # pragma: no cover - execv does not return


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``shims curl BIN_DIR ARGS...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "curl":
        return curl_main(Path(argv[1]), argv[2:])
    print("usage: python -m pytest_gpubench.sandbox.shims curl BIN_DIR [ARGS...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
