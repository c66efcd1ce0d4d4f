"""One emulated GPU instance: a directory, an ``instance.json`` and an SSH server.

Layout of an instance (``<sandbox workdir>/instances/<session id>/``)::

    instance.json   the contract with the stand-ins (see :func:`instance_document`)
    bin/            nvidia-smi, python3, curl, df, vllm, llama-server, text-generation-launcher,
                    docker and, when preinstalled, ollama
    python/         on PYTHONPATH: the ``sglang`` package (``python3 -m sglang.launch_server``),
                    ``pynvml`` (NVML, importable only with the ``gpu_driver`` fault's ``nvml``) and the
                    stand-in ``torch`` (:mod:`.instances`)
    wheels/         only without torch: its wheel, for an offline ``pip install torch``
    sysbin/         only with missing tools: links to the host's programs, minus those
    home/           $HOME and the working directory of every command
    state/          the stand-ins' shared state (pulled models, loaded models)
    tmp/            $TMPDIR
    run/            the stand-ins' answering service socket (:mod:`.standin_service`)
    sshd/           with ``ssh_server="openssh"`` only: sshd's config, keys and log

The SSH server is asyncssh in this process (:mod:`.sshd`, the default) or OpenSSH's
``sshd`` as a child process (:mod:`.sshd`); commands see the same machine either way.

Every command runs with ``PATH=<bin>:<system PATH>``, ``PYTHONPATH=<python>``, ``HOME``, ``TMPDIR``,
``OLLAMA_HOST=127.0.0.1:<port of this instance>``,
``GPUBENCH_SANDBOX_INSTANCE=<instance.json>``, ``PIP_NO_INDEX=1`` and
``PIP_FIND_LINKS=<wheels>``. An instance built with
``missing_tools`` (the ``missing_tools`` fault) has ``PATH=<bin>:<sysbin>`` instead,
so that neither a stand-in nor the host's own copy of those tools is found.
Instances share the host's file
system: a script that writes a literal ``/tmp/x`` path shares it with every other
instance; ``$HOME`` and ``$TMPDIR`` are private.

Stopping an instance kills everything it started: its sshd and what sshd forked,
each command's process group, and any process still carrying this instance's
``GPUBENCH_SANDBOX_INSTANCE`` (a daemon that called ``setsid`` escapes its group,
not its environment).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import zipfile
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from ..runtime_facts import all_facts
from . import lifeline, pynvml_standin, shims, sshd, worker_standin
from .catalog import Catalog, OfferSpec
from .standin_service import StandinService
from .standin_state import REQUEST_LOG_FILE, PullFault, StateStore, StreamFault, count_served

log = logging.getLogger("pytest_gpubench.sandbox")
INSTANCE_ENV = shims.INSTANCE_ENV
SSH_SERVERS = ("asyncssh", "openssh")
_KILL_GRACE = 1.0
#: How long a silently vanished instance keeps its frozen SSH connections open
#: (real seconds) before the sandbox lets them close.
SILENT_HOLD_SECONDS = 600.0


class UnsupportedFault(ValueError):
    """A fault this instance's SSH server cannot emulate."""


class SshEndpoint(Protocol):
    """An instance's SSH server, as :class:`Instance` drives it."""

    async def start(self) -> int:
        """Start serving; returns the loopback port."""

    async def stop_accepting(self) -> set[int]:
        """Take no more connections; returns process groups of commands it knows of."""

    async def finish(self) -> None:
        """Release the rest, once the instance's processes are dead."""


def instance_document(
    catalog: Catalog, offer: OfferSpec, session_id: str, time_scale: float, state_dir: Path, disk_gb: int = 0
) -> dict[str, Any]:
    """The ``instance.json`` contract: exactly the keys the stand-ins read.

    Durations in it (``install_seconds``, ``load_seconds``) are emulated seconds:
    the reader multiplies them by ``time_scale``. Rates are never scaled. ``disk_gb``
    is what the session asked for (0: nothing, the provider's default applies).
    """
    gpu = catalog.gpus[offer.gpu_type]
    models = {}
    for name, spec in catalog.models.items():
        tps, ttft, _origin = catalog.rate(offer.gpu_type, offer.provider, name)
        models[name] = {
            "size_bytes": spec.size_bytes,
            "family": spec.family,
            "parameter_size": spec.parameter_size,
            "quantization_level": spec.quantization_level,
            "digest": catalog.model_digest(name),
            "tokens_per_second": float(tps),
            "ttft_ms": float(ttft),
            "load_seconds": float(spec.load_seconds),
            "thinking": spec.thinking,
            "accuracy": spec.accuracy,
            "batch_ceiling_factor": catalog.batch_ceiling(offer.gpu_type, offer.provider, name) / tps,
            # By the program that serves each runtime (the stand-in knows its program, not the runtime).
            "batch_ceiling_factors": {facts.sandbox.program: catalog.batch_ceiling(
                offer.gpu_type, offer.provider, name, facts.name) / tps for facts in all_facts() if facts.sandbox},
        }
    return {
        "session_id": session_id,
        "time_scale": time_scale,
        "gpu": {
            "gpu_type": offer.gpu_type,
            "name": gpu.name,
            "memory_mib": gpu.memory_mib,
            "count": offer.gpu_count,
            "driver_version": gpu.driver_version,
            "cuda_version": gpu.cuda_version,
            "power_limit_w": gpu.power_limit_w,
            "compute_capability": gpu.compute_capability,
            "sm_clock_max_mhz": gpu.clocks.sm_max_mhz if gpu.clocks else None,
            "mem_clock_max_mhz": gpu.clocks.mem_max_mhz if gpu.clocks else None,
            "microbench": gpu.microbench.model_dump() if gpu.microbench else None,
        },
        "host": gpu.host.model_dump(),
        "ollama": {
            "version": catalog.ollama_version,
            "pull_mb_per_s": float(catalog.pull_mb_per_s(offer)),
            "install_seconds": float(catalog.timings.ollama_install_seconds),
        },
        "models": models,
        "state_dir": str(state_dir),
        "offload_penalty": catalog.offload_penalty,
        "disk": {"size_gb": catalog.disk_gb(offer, disk_gb), "system_gb": catalog.system_disk_gb},
        "docker_images": {name: int(gb * 1024 ** 3) for name, gb in catalog.docker_images.items()},
    }


def link_system_programs(target: Path, search_path: str, hidden: frozenset[str]) -> int:
    """Fill ``target`` with links to the programs on ``search_path``, except ``hidden`` ones.

    The first of a name wins, as in a ``PATH`` lookup. A hidden tool hides its
    versioned names too (``python3`` hides ``python3.11``). Returns how many were linked.
    """
    target.mkdir(parents=True, exist_ok=True)
    linked = 0
    for directory in search_path.split(os.pathsep):
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for name in names:
            if any(name == tool or name.startswith(tool + ".") for tool in hidden):
                continue
            source, link = os.path.join(directory, name), target / name
            if link.is_symlink() or link.exists() or not os.path.isfile(source) or not os.access(source, os.X_OK):
                continue
            link.symlink_to(os.path.abspath(source))
            linked += 1
    return linked


#: Where ports that are chosen now and bound later come from: below the kernel's
#: ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 by default), from which
#: every ``bind(0)`` and every outgoing connection on the machine takes its port. A port
#: chosen there can be taken by any of them in the seconds before Ollama's stand-in binds
#: it ("address already in use"); below it, only another sandbox could, by the same
#: random pick.
_CHOSEN_PORTS = range(20000, 32768)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(avoid: set[int] | None = None) -> int:
    """A loopback TCP port nobody listens on now (and not in ``avoid``), for a server that
    binds it later: outside the ephemeral range (see ``_CHOSEN_PORTS``)."""
    low = min(_CHOSEN_PORTS.stop, _ephemeral_low())
    for _ in range(200):
        port = random.randrange(_CHOSEN_PORTS.start, low)
        if avoid and port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port found")


class Instance:
    """A running emulated machine for one session."""

    def __init__(
        self,
        root: Path,
        document: dict[str, Any],
        authorized_key: asyncssh.SSHKey,
        *,
        ollama_port: int,
        ollama_preinstalled: bool,
        ssh_server: str = "asyncssh",
        missing_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.root = root
        self.missing_tools = frozenset(missing_tools)
        self.sysbin_dir = root / "sysbin"
        self.document = document
        self.ollama_port = ollama_port
        self.ollama_preinstalled = ollama_preinstalled
        self.bin_dir = root / "bin"
        self.home = root / "home"
        self.state_dir = Path(document["state_dir"])
        self._served_at_stop: dict[str, int] | None = None
        self.tmp_dir = root / "tmp"
        self.python_dir = root / "python"
        self.wheels_dir = root / "wheels"
        self.spec_path = root / "instance.json"
        self._service = StandinService(self.spec_path, self.bin_dir)
        self.ssh_port: int | None = None
        self._groups: set[int] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._ssh = self._endpoint(ssh_server, authorized_key)
        self.stopped = False
        #: Set while a silent stop holds the SSH connections frozen.
        self._frozen_until: asyncio.Task[None] | None = None

    def _endpoint(self, ssh_server: str, authorized_key: asyncssh.SSHKey) -> SshEndpoint:
        if ssh_server == "openssh":
            return sshd.OpenSshEndpoint(
                self.root / "sshd",
                authorized_key=authorized_key,
                environment=self.environment,
                # Ollama's port is chosen but not yet bound: sshd must not take it.
                choose_port=lambda: free_port({self.ollama_port}),
            )
        if ssh_server != "asyncssh":
            raise ValueError(f"ssh_server must be one of {', '.join(SSH_SERVERS)}, not {ssh_server!r}")
        hooks = sshd.InstanceHooks(
            authorized_key=authorized_key,
            environment=self.environment,
            cwd=self.home,
            on_process=self._groups.add,
        )
        return sshd.AsyncsshEndpoint(hooks)

    # -- life cycle ---------------------------------------------------------------

    def build(self) -> None:
        """Create the directory tree, ``instance.json`` and ``bin/``."""
        for path in (self.bin_dir, self.home, self.state_dir, self.tmp_dir):
            path.mkdir(parents=True, exist_ok=True)
        self.spec_path.write_text(json.dumps(self.document, indent=2) + "\n", encoding="utf-8")
        missing, bin_dir = self.missing_tools, self.bin_dir
        if "nvidia-smi" not in missing:
            shims.write_executable(bin_dir / "nvidia-smi", shims.nvidia_smi_wrapper(bin_dir))
        if "curl" not in missing:
            shims.write_executable(bin_dir / "curl", shims.curl_wrapper(bin_dir))
        # Always there, as on any Linux box: it reports the emulated disk, not the host's.
        shims.write_executable(bin_dir / "df", shims.df_wrapper(bin_dir))
        if self.ollama_preinstalled:
            shims.write_executable(bin_dir / "ollama", shims.ollama_wrapper(bin_dir))
        # Always there: no flow runs them unless asked, so instances that never do are unchanged.
        # Every runtime's launcher or package, as its declaration says the sandbox imitates it.
        for imitation in (i for i in shims.imitations() if i.program not in missing):
            if imitation.kind == "launcher":
                shims.write_executable(bin_dir / imitation.program,
                                       shims.launcher_wrapper(imitation.program, imitation.stand_in))
            elif imitation.kind == "python-package" and imitation.stand_in == shims.SGLANG_PACKAGE:
                shims.write_sglang_package(self.python_dir, imitation.program)
        # Always there: it imports only when the instance's driver has NVML (gpu_tools.nvml),
        # and keeps a real NVML of the machine the sandbox runs on out of reach.
        self.python_dir.mkdir(parents=True, exist_ok=True)
        (self.python_dir / "pynvml.py").write_text(pynvml_standin.shim_source(shims.PACKAGE_ROOT), encoding="utf-8")
        if "docker" not in missing:
            shims.write_executable(bin_dir / "docker", shims.module_wrapper(shims.DOCKER_MODULE))
        if "torch" in missing:  # `pip install torch` gets the stand-in from the local wheel
            build_torch_wheel(self.wheels_dir)
        else:
            write_torch_package(self.python_dir)
        python3 = self.bin_dir / "python3"
        if "python3" not in missing and not python3.exists():
            python3.symlink_to(sys.executable)
        if missing:
            link_system_programs(self.sysbin_dir, os.environ.get("PATH", "/usr/bin:/bin"), missing)

    async def start_ssh(self) -> int:
        """Start the stand-ins' answering service, then the SSH server; returns the
        SSH port once it accepts connections."""
        await self._service.start()
        self.ssh_port = await self._ssh.start()
        return self.ssh_port

    def environment(self) -> dict[str, str]:
        """The environment of every command on this instance."""
        system_path = str(self.sysbin_dir) if self.missing_tools else os.environ.get("PATH", "/usr/bin:/bin")
        env = {
            "PATH": f"{self.bin_dir}{os.pathsep}{system_path}",
            "HOME": str(self.home),
            "USER": "root",
            "LOGNAME": "root",
            "SHELL": "/bin/bash",
            "TMPDIR": str(self.tmp_dir),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "OLLAMA_HOST": f"127.0.0.1:{self.ollama_port}",
            "PYTHONPATH": str(self.python_dir),
            # pip installs offline, from the sandbox's own wheels (the stand-in torch: build_torch_wheel below).
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(self.wheels_dir),
            INSTANCE_ENV: str(self.spec_path),
            # Its daemons (ollama serve) end when the sandbox does, even a killed one.
            lifeline.OWNER_ENV: lifeline.owner_token(),
        }
        return env

    def run_background(self, script: str, log_name: str) -> None:
        """Run ``script`` detached on the instance (on-start commands), logging to $HOME."""
        task = asyncio.create_task(self._run_logged(script, self.home / log_name))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _run_logged(self, script: str, log_path: Path) -> None:
        with open(log_path, "ab") as log_file:
            child = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                script,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env=self.environment(),
                cwd=str(self.home),
                start_new_session=True,
                preexec_fn=lifeline.die_with_parent(),
            )
        self._groups.add(child.pid)
        await child.wait()

    async def stop(self, *, remove: bool = True, silent: bool = False) -> None:
        """Kill every process of the instance, close SSH, remove its directory.

        ``silent``: the instance vanishes as a host dropped from the network does: its
        SSH connections stay open but carry nothing, until ``SILENT_HOLD_SECONDS``
        pass or ``stop`` is called again (asyncssh SSH server only).
        """
        if self.stopped:
            if self._frozen_until is not None:
                self._frozen_until.cancel()
                self._frozen_until = None
                await self._ssh.finish()
            return
        if silent:
            self._asyncssh("a silent kill").freeze()
        self.stopped = True
        ssh_groups = await self._ssh.stop_accepting()
        await kill_instance_processes(self._groups | ssh_groups, str(self.spec_path))
        await self._service.stop()
        if silent:
            self._frozen_until = asyncio.create_task(self._thaw_later())
        else:
            await self._ssh.finish()
        pending = [t for t in self._background if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        for task in pending:
            task.cancel()
        # Its processes are dead: the count is final, and must outlive the directory.
        self._served_at_stop = count_served(self.state_dir)
        self._keep_request_log()
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)


    @property
    def request_log(self) -> Path:
        """Where its stand-ins' request log is: in its state directory while it runs, then
        beside the instances' directory (``request-logs/<session>.jsonl``), kept until the
        sandbox resets."""
        return self.state_dir / REQUEST_LOG_FILE if not self.stopped else self._kept_request_log

    @property
    def _kept_request_log(self) -> Path:
        return self.root.parent.parent / "request-logs" / f"{self.root.name}.jsonl"

    def _keep_request_log(self) -> None:
        kept = self._kept_request_log
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.state_dir / REQUEST_LOG_FILE, kept)
        except OSError:
            pass  # no request served: nothing to keep

    @property
    def served_requests(self) -> dict[str, int]:
        """Requests its stand-ins delivered whole, by kind (:mod:`.standin_state`): so far, or in all once stopped."""
        if self._served_at_stop is not None:
            return self._served_at_stop
        return count_served(self.state_dir)

    async def _thaw_later(self) -> None:
        await asyncio.sleep(SILENT_HOLD_SECONDS)
        self._frozen_until = None
        await self._ssh.finish()

    def _asyncssh(self, what: str) -> sshd.AsyncsshEndpoint:
        if not isinstance(self._ssh, sshd.AsyncsshEndpoint):
            raise UnsupportedFault(f"{what} needs the asyncssh SSH server (the default), not openssh")
        return self._ssh

    # -- faults ---------------------------------------------------------------------

    def drop_ssh(self) -> int:
        """Cut the open SSH connections (commands keep running); returns how many."""
        return self._asyncssh("drop_ssh").drop_connections()

    async def stop_ollama(self, hang: bool = False) -> int | None:
        """Crash the instance's ``ollama serve`` (SIGKILL), or with ``hang`` freeze it
        (SIGSTOP: it keeps its port and answers nothing); returns its pid, or None if none ran."""
        pid = StateStore(self.state_dir).read_pid()
        marker = f"{INSTANCE_ENV}={self.spec_path}".encode()
        if pid is None or pid not in _marked_processes(marker):
            return None  # only a process of this instance, never a recycled pid
        if hang:
            _signal(os.kill, pid, signal.SIGSTOP)
            return pid
        _signal(os.kill, pid, signal.SIGKILL)
        deadline = asyncio.get_running_loop().time() + 5.0
        while pid in _marked_processes(marker) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        return pid

    async def stop_servers(self, hang: bool = False) -> list[int]:
        """Crash every OpenAI-server launcher running on the instance (SIGKILL), or with ``hang``
        freeze them (SIGSTOP); returns their pids (none: nothing ran)."""
        marker = f"{INSTANCE_ENV}={self.spec_path}".encode()
        pids = [pid for pid in _marked_processes(marker) if shims.LAUNCHERS_MODULE.encode() in process_cmdline(pid)]
        for pid in pids:
            _signal(os.kill, pid, signal.SIGSTOP if hang else signal.SIGKILL)
        deadline = asyncio.get_running_loop().time() + 5.0
        while not hang and set(pids) & set(_marked_processes(marker)) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        return pids

    def arm_stream_fault(self, fault: StreamFault) -> None:
        """Add a stream fault for the instance's Ollama stand-in to apply."""
        store = StateStore(self.state_dir)
        store.write_stream_faults([*store.read_stream_faults(), fault])

    def arm_pull_fault(self, fault: PullFault) -> None:
        """Add a pull fault for the instance's Ollama stand-in to apply."""
        store = StateStore(self.state_dir)
        store.write_pull_faults([*store.read_pull_faults(), fault])

    def clear_stream_faults(self) -> int:
        """Disarm the instance's stream and pull faults (its worker containers' too); returns how many there were."""
        store = StateStore(self.state_dir)
        count = len(store.read_stream_faults()) + len(store.read_pull_faults())
        if count:
            store.write_stream_faults([])
            store.write_pull_faults([])
        return count + worker_standin.clear_faults(self.state_dir)

    def arm_worker_fault(self, fault: dict[str, Any]) -> dict[str, Any]:
        """Add a fault for the instance's worker containers (:mod:`.worker_standin`)."""
        return worker_standin.arm_fault(self.state_dir, fault)


async def kill_instance_processes(groups: set[int], marker_value: str) -> int:
    """SIGTERM, then SIGKILL, every process of an instance; returns how many were hit.

    A process belongs to the instance when it carries ``GPUBENCH_SANDBOX_INSTANCE``
    with this instance's path, or sits in a process group one of its commands
    started (only groups that still hold such a marked process, so a recycled
    process-group id is never hit).
    """
    marker = f"{INSTANCE_ENV}={marker_value}".encode()
    targets = _marked_processes(marker)
    live_groups = set(targets.values()) & groups
    if not os.path.isdir("/proc/self"):
        live_groups = set(groups)  # no /proc (macOS): the process groups are all we know
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in live_groups:
            _signal(os.killpg, pgid, sig)
        for pid in list(targets):
            _signal(os.kill, pid, sig)
        deadline = asyncio.get_running_loop().time() + (_KILL_GRACE if sig == signal.SIGTERM else 2.0)
        while asyncio.get_running_loop().time() < deadline:
            targets = _marked_processes(marker)
            if not targets:
                return len(live_groups)
            await asyncio.sleep(0.02)
    return len(live_groups)


def _signal(send: Any, target: int, sig: signal.Signals) -> None:
    try:
        send(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def process_cmdline(pid: int) -> bytes:
    """``/proc/PID/cmdline`` (NUL-separated words); empty for a process gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _marked_processes(marker: bytes) -> dict[int, int]:
    """``{pid: pgid}`` of live processes whose environment carries ``marker``."""
    found: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        if marker not in environ.split(b"\0"):
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if fields and fields[0] == b"Z":
            continue  # a zombie is already dead; its parent reaps it
        try:
            found[pid] = int(fields[2])
        except (IndexError, ValueError):
            found[pid] = pid
    return found


# ----------------------------------------------------------------------
#
# The stand-in ``torch`` on a sandbox instance: importable at once, or installable with pip.
#
# An instance has the stand-in (:mod:`.torch_standin`) as the package ``torch`` in its
# ``python/`` directory, which is on its ``PYTHONPATH``, so ``python3 -c 'import torch'``
# works as on an image with torch. An instance booted without it (the ``missing_tools``
# fault with ``torch``) has instead a wheel of it in ``wheels/``, and its environment says
# ``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS=<wheels>``: the plugin's ``python3 -m venv`` and
# ``pip install torch`` then install the stand-in into the venv, offline, as they would
# install the real torch from PyPI.


#: The version pip sees (the package's ``__version__`` adds the sandbox's local label).
WHEEL_VERSION = "2.5.1"
STANDIN = Path(__file__).with_name("torch_standin.py")


def write_torch_package(python_dir: Path) -> None:
    """``python_dir/torch/__init__.py``: the stand-in, importable as ``torch``."""
    package = python_dir / "torch"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(STANDIN.read_text(encoding="utf-8"), encoding="utf-8")


def build_torch_wheel(directory: Path) -> Path:
    """A pure-Python wheel of the stand-in in ``directory`` (for ``pip install torch``); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"torch-{WHEEL_VERSION}.dist-info"
    files = {
        "torch/__init__.py": STANDIN.read_bytes(),
        f"{dist_info}/METADATA": (f"Metadata-Version: 2.1\nName: torch\nVersion: {WHEEL_VERSION}\n"
                                  "Summary: gpubench sandbox stand-in for torch\n").encode(),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: pytest-gpubench sandbox\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = "".join(f"{name},sha256={_digest(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / f"torch-{WHEEL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
