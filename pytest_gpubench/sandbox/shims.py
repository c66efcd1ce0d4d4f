"""The small programs in a sandbox instance's ``bin/``, and the ``curl`` shim itself.

Each stand-in (``nvidia-smi``, ``ollama``, ``df``) is a two-line ``sh`` wrapper that runs a
module of this package with the sandbox's own Python, so the instance needs nothing
installed. ``curl`` is a wrapper too: for exactly ``https://ollama.com/install.sh``
it answers an install script that, piped to ``sh``, takes the (time-scaled) install
time and writes the ``ollama`` wrapper into ``bin/``; any other URL goes to the real
``curl``. So the real default install command works unchanged on an instance::

    curl -fsSL https://ollama.com/install.sh | sh

Run as ``python -m pytest_gpubench.sandbox.shims curl BIN_DIR ARGS...``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

INSTALL_URL = "https://ollama.com/install.sh"
INSTANCE_ENV = "GPUBENCH_SANDBOX_INSTANCE"
# The directory that holds the pytest_gpubench package: wrappers put it on
# PYTHONPATH so the stand-ins import even when the package is not installed.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def module_wrapper(module: str, *fixed_args: str, python: str | None = None) -> str:
    """An ``sh`` script that runs ``python -m <module> [fixed args] "$@"``."""
    python = python or sys.executable
    fixed = "".join(f" {shlex.quote(arg)}" for arg in fixed_args)
    return (
        "#!/bin/sh\n"
        "# gpubench sandbox stand-in (pytest_gpubench.sandbox)\n"
        f'PYTHONPATH={shlex.quote(str(PACKAGE_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n'
        "export PYTHONPATH\n"
        f'exec {shlex.quote(python)} -m {module}{fixed} "$@"\n'
    )


def ollama_wrapper() -> str:
    """The ``ollama`` command: the other stand-in module of this package."""
    return module_wrapper("pytest_gpubench.sandbox.ollama_standin")


def nvidia_smi_wrapper() -> str:
    """The ``nvidia-smi`` command."""
    return module_wrapper("pytest_gpubench.sandbox.nvidia_smi_standin")


def df_wrapper() -> str:
    """The ``df`` command: the instance's emulated disk."""
    return module_wrapper("pytest_gpubench.sandbox.df_standin")


def curl_wrapper(bin_dir: Path) -> str:
    """The ``curl`` command; it needs its own directory to find the real curl."""
    return module_wrapper("pytest_gpubench.sandbox.shims", "curl", str(bin_dir))


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
{ollama_wrapper()}GPUBENCH_SANDBOX_EOF
chmod 755 {partial}
mv -f {partial} {shlex.quote(str(target))}
status "Creating ollama user..."
status "Adding ollama user to video group..."
status "Adding current user to ollama group..."
warning "systemd is not running"
status "NVIDIA GPU installed."
status 'Install complete. Run "ollama" from the command line.'
"""


def _scaled_install_seconds() -> float:
    """The install time of this instance, shrunk by its time scale (0 if unknown)."""
    path = os.environ.get(INSTANCE_ENV)
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


def curl_main(bin_dir: Path, args: list[str]) -> int:
    """Answer the Ollama install URL here; hand anything else to the real curl."""
    urls = [a for a in args if a.startswith(("http://", "https://"))]
    if urls == [INSTALL_URL]:
        script = install_script(bin_dir, _scaled_install_seconds())
        target = _output_target(args)
        if target is None:
            sys.stdout.write(script)
            sys.stdout.flush()
        else:
            Path(target).write_text(script, encoding="utf-8")
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
