"""GPU telemetry: nvidia-smi line parsing, and sampling through the sandbox's SSH server.

The sampling tests run the sandbox's own instance SSH server (``sandbox.sshd``, a real
asyncssh server running commands with bash) with the nvidia-smi stand-in on PATH,
the way a sandbox instance does.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import asyncssh
import pytest
from standin_helpers import write_instance

from pytest_gpubench.remote.ssh import Connection
from pytest_gpubench.remote.readings import GPUStats
from pytest_gpubench.sandbox import shims, sshd
from pytest_gpubench.remote.telemetry import (
    GpuSample,
    RemoteClock,
    nvidia_smi_loop_command,
    parse_sample_line,
    sample_gpus,
    summarize_gpu,
)

# ------------------------------------------------------------------ pure parsing


def _stamp(moment: datetime, utc_offset_hours: float = 0.0) -> str:
    local = moment + timedelta(hours=utc_offset_hours)
    return local.strftime("%Y/%m/%d %H:%M:%S.") + f"{local.microsecond // 1000:03d}"


MOMENT = datetime(2026, 11, 22, 3, 0, 1, 500_000, tzinfo=timezone.utc)


def test_a_full_line_becomes_a_sample():
    line = f"{_stamp(MOMENT)}, 1, 87, 20480, 71, 398.20"
    sample = parse_sample_line(line, arrival=MOMENT.timestamp() + 0.2)
    assert sample == GpuSample(t=MOMENT.timestamp(), gpu=1, utilization_pct=87.0, memory_used_mib=20480,
                               temperature_c=71.0, power_draw_w=398.2)


@pytest.mark.parametrize("missing", ["[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", ""])
def test_missing_values_become_none(missing):
    line = f"{_stamp(MOMENT)}, 0, {missing}, {missing}, {missing}, {missing}"
    sample = parse_sample_line(line, arrival=MOMENT.timestamp())
    assert sample is not None and sample.gpu == 0
    assert (sample.utilization_pct, sample.memory_used_mib, sample.temperature_c, sample.power_draw_w) == (
        None, None, None, None)


def test_not_supported_power_on_one_gpu_only():
    sample = parse_sample_line(f"{_stamp(MOMENT)}, 3, 12, 1024, 40, [Not Supported]", arrival=MOMENT.timestamp())
    assert sample.gpu == 3 and sample.power_draw_w is None and sample.temperature_c == 40


@pytest.mark.parametrize("line", [
    "",
    "   ",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "timestamp, index, utilization.gpu [%], memory.used [MiB], temperature.gpu, power.draw [W]",
    'Field "timestamp" is not a valid field to query.',
    f"{_stamp(MOMENT)}, [N/A], 1, 2, 3, 4",
    f"{_stamp(MOMENT)}, -1, 1, 2, 3, 4",
    "2026/11/22 03:00:01.500, 0, 1\n2026/11/22 03:00:01.500, 1, 1",  # two lines are not one sample
    '"unterminated, 0, 1, 2, 3, 4',
])
def test_lines_that_are_not_readings_are_skipped(line):
    assert parse_sample_line(line, arrival=MOMENT.timestamp()) is None


def test_a_short_line_keeps_what_it_has():
    sample = parse_sample_line(f"{_stamp(MOMENT)}, 0, 55", arrival=MOMENT.timestamp())
    assert sample.utilization_pct == 55 and sample.memory_used_mib is None and sample.power_draw_w is None


def test_unreadable_timestamp_uses_the_arrival_time():
    sample = parse_sample_line("yesterday-ish, 0, 1, 2, 3, 4", arrival=1234.5)
    assert sample.t == 1234.5 and sample.gpu == 0


@pytest.mark.parametrize("hours", [0, 5.5, -8, 13, -3.5])
def test_the_instance_time_zone_is_inferred_from_the_first_line(hours):
    clock = RemoteClock()
    arrival = MOMENT.timestamp() + 0.3  # the line arrives a little after it was stamped
    first = parse_sample_line(f"{_stamp(MOMENT, hours)}, 0, 1, 2, 3, 4", arrival=arrival, clock=clock)
    assert first.t == pytest.approx(MOMENT.timestamp())
    assert clock.offset == hours * 3600
    # Later lines keep the instance's own spacing, however late they arrive here.
    later = MOMENT + timedelta(seconds=5)
    second = parse_sample_line(f"{_stamp(later, hours)}, 0, 1, 2, 3, 4", arrival=arrival + 60, clock=clock)
    assert second.t == pytest.approx(later.timestamp())


def test_loop_command_uses_seconds_or_milliseconds():
    assert nvidia_smi_loop_command(5).endswith(" -l 5")
    assert nvidia_smi_loop_command(1.0).endswith(" -l 1")
    assert nvidia_smi_loop_command(0.25).endswith(" -lms 250")
    assert nvidia_smi_loop_command(1.5).endswith(" -lms 1500")
    assert nvidia_smi_loop_command(2).startswith(
        "nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,temperature.gpu,power.draw "
        "--format=csv,noheader,nounits")
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="positive number of seconds"):
            nvidia_smi_loop_command(bad)


def test_summary_of_no_samples_is_all_zero():
    assert summarize_gpu([]) == GPUStats()


def test_summary_averages_and_maxima_ignore_missing_values():
    samples = [
        GpuSample(t=1, gpu=0, utilization_pct=50, memory_used_mib=1000, temperature_c=60, power_draw_w=None),
        GpuSample(t=1, gpu=1, utilization_pct=100, memory_used_mib=1001, temperature_c=None, power_draw_w=None),
        GpuSample(t=2, gpu=0, utilization_pct=None, memory_used_mib=2000, temperature_c=70, power_draw_w=None),
    ]
    stats = summarize_gpu(samples)
    assert stats.avg_utilization_pct == 75 and stats.max_utilization_pct == 100
    assert stats.avg_memory_used_mib == 1334 and stats.max_memory_used_mib == 2000
    assert isinstance(stats.avg_memory_used_mib, int) and isinstance(stats.max_memory_used_mib, int)
    assert stats.avg_temperature_c == 65 and stats.max_temperature_c == 70
    assert stats.avg_power_draw_w == 0 and stats.max_power_draw_w == 0  # never reported


# --------------------------------------------------- sampling with a fake stream


class FakeConnection:
    """Yields given lines, then ends or fails as a dropped SSH connection does."""

    def __init__(self, lines, error: Exception | None = None, hang: bool = False) -> None:
        self.lines, self.error, self.hang = lines, error, hang
        self.commands: list[str] = []
        self.closed = asyncio.Event()

    async def stream_lines(self, command: str, *, stdin: str):
        self.commands.append(command)
        try:
            for line in self.lines:
                yield line
            if self.error is not None:
                raise self.error
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed.set()  # where the real Connection terminates the remote command


def test_bad_lines_are_skipped_and_a_lost_connection_returns_the_samples_so_far():
    now = datetime.now(timezone.utc)
    lines = [f"{_stamp(now)}, 0, 10, 300, 40, 50.00", "garbage", f"{_stamp(now)}, 1, 20, 300, 41, 51.00"]
    conn = FakeConnection(lines, error=asyncssh.ConnectionLost("Connection lost"))
    samples = asyncio.run(sample_gpus(conn, 0.5, asyncio.Event()))
    assert [s.gpu for s in samples] == [0, 1]
    assert conn.commands == [nvidia_smi_loop_command(0.5)] and conn.closed.is_set()


def test_stop_ends_a_stream_that_would_run_forever():
    now = datetime.now(timezone.utc)

    async def go():
        conn = FakeConnection([f"{_stamp(now)}, 0, 10, 300, 40, 50.00"], hang=True)
        stop = asyncio.Event()
        seen: list[GpuSample] = []

        def on_sample(sample):
            seen.append(sample)
            stop.set()

        samples = await asyncio.wait_for(sample_gpus(conn, 1, stop, on_sample=on_sample), 10)
        return samples, seen, conn

    samples, seen, conn = asyncio.run(go())
    assert samples == seen and len(samples) == 1
    assert conn.closed.is_set()  # the stream's cleanup ran: the remote command is terminated


def test_a_failing_callback_does_not_end_sampling():
    now = datetime.now(timezone.utc)
    lines = [f"{_stamp(now)}, 0, 10, 300, 40, 50.00"] * 3

    def broken(sample):
        raise RuntimeError("callback bug")

    samples = asyncio.run(sample_gpus(FakeConnection(lines), 1, asyncio.Event(), on_sample=broken))
    assert len(samples) == 3


# ---------------------------------------------- sampling through the sandbox's sshd


@pytest.fixture
def instance(tmp_path):
    """A sandbox-like instance with two GPUs behind the sandbox's SSH server, on its own loop."""
    spec_path = write_instance(tmp_path / "instance")
    spec = json.loads(spec_path.read_text())
    spec["gpu"]["count"] = 2
    spec_path.write_text(json.dumps(spec))
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    shims.write_executable(bin_dir / "nvidia-smi", shims.nvidia_smi_wrapper())
    extra: dict[str, str] = {}
    pids: list[int] = []

    def environment() -> dict[str, str]:
        path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
        return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8",
                "GPUBENCH_SANDBOX_INSTANCE": str(spec_path), **extra}

    client_key = asyncssh.generate_private_key("ssh-ed25519")
    hooks = sshd.InstanceHooks(authorized_key=client_key, environment=environment, cwd=home,
                               on_process=pids.append)
    loop = asyncio.new_event_loop()
    acceptor = loop.run_until_complete(sshd.listen(hooks, asyncssh.generate_private_key("ssh-ed25519")))
    port = acceptor.sockets[0].getsockname()[1]
    yield SimpleNamespace(loop=loop, port=port, key=client_key.export_private_key().decode(), hooks=hooks,
                          env=extra, pids=pids)
    acceptor.close()
    for conn in list(hooks.connections):
        conn.abort()
    if hooks.handlers:
        loop.run_until_complete(asyncio.wait(list(hooks.handlers), timeout=15))
    loop.run_until_complete(acceptor.wait_closed())
    loop.close()


async def _connect(instance) -> Connection:
    return await Connection.open("127.0.0.1", instance.port, "root", instance.key, timeout=15)


def _stop_after(count: int, stop: asyncio.Event, seen: list[GpuSample]):
    def on_sample(sample: GpuSample) -> None:
        seen.append(sample)
        if len(seen) >= count:
            stop.set()

    return on_sample


async def _handlers_done(hooks, timeout: float = 15) -> bool:
    """Whether every command the server ran has exited (its handler ends with it)."""
    pending = list(hooks.handlers)
    if pending:
        await asyncio.wait(pending, timeout=timeout)
    return not any(not task.done() for task in pending)


def test_samples_every_gpu_until_stopped_then_the_remote_command_ends(instance):
    async def go():
        conn = await _connect(instance)
        stop, seen = asyncio.Event(), []
        started = time.time()
        samples = await asyncio.wait_for(
            sample_gpus(conn, 0.1, stop, on_sample=_stop_after(6, stop, seen)), 60)
        ended = time.time()
        finished = await _handlers_done(instance.hooks)
        await conn.close()
        return samples, started, ended, finished

    samples, started, ended, finished = instance.loop.run_until_complete(go())
    assert len(samples) >= 6
    assert {s.gpu for s in samples} == {0, 1}
    for sample in samples:
        assert started - 5 <= sample.t <= ended + 5  # the instance's clock, read as UTC
        assert sample.memory_used_mib == 300  # driver context only: no model loaded
        assert sample.utilization_pct == 0
        assert sample.temperature_c is not None and sample.power_draw_w is not None and sample.power_draw_w > 0
    gpu0 = [s.t for s in samples if s.gpu == 0]
    assert gpu0 == sorted(gpu0) and len(gpu0) >= 3
    # One long-lived command (-lms 100), not one command per sample.
    assert len(instance.pids) == 1
    assert finished, "the remote nvidia-smi kept running after stop"
    with pytest.raises(ProcessLookupError):
        os.kill(instance.pids[0], 0)
    stats = summarize_gpu(samples)
    assert stats.avg_memory_used_mib == 300 and stats.max_power_draw_w > 0


def test_values_the_gpu_does_not_report_are_none(instance):
    instance.env["GPUBENCH_SANDBOX_SMI_NA"] = "power.draw,temperature.gpu"

    async def go():
        conn = await _connect(instance)
        stop, seen = asyncio.Event(), []
        samples = await asyncio.wait_for(sample_gpus(conn, 0.1, stop, on_sample=_stop_after(2, stop, seen)), 60)
        await conn.close()
        return samples

    samples = instance.loop.run_until_complete(go())
    assert len(samples) >= 2
    assert all(s.power_draw_w is None and s.temperature_c is None for s in samples)
    assert all(s.memory_used_mib == 300 for s in samples)
    stats = summarize_gpu(samples)
    assert stats.avg_power_draw_w == 0 and stats.max_temperature_c == 0 and stats.max_memory_used_mib == 300


@pytest.mark.parametrize("env", [{"GPUBENCH_SANDBOX_SMI_FAULT": "driver"}, {"PATH": "/usr/bin:/bin"}],
                         ids=["broken-driver", "no-nvidia-smi"])
def test_an_nvidia_smi_that_fails_gives_no_samples_and_no_error(instance, env):
    instance.env.update(env)

    async def go():
        conn = await _connect(instance)
        # stop is never set: the command's own exit ends sampling
        samples = await asyncio.wait_for(sample_gpus(conn, 0.1, asyncio.Event()), 60)
        status = conn.last_exit_status
        await conn.close()
        return samples, status

    samples, status = instance.loop.run_until_complete(go())
    assert samples == []
    assert status in (9, 127)


def test_a_lost_connection_returns_the_samples_so_far(instance):
    async def go():
        conn = await _connect(instance)
        got_two, seen = asyncio.Event(), []
        task = asyncio.ensure_future(sample_gpus(conn, 0.1, asyncio.Event(), on_sample=_stop_after(2, got_two, seen)))
        await asyncio.wait_for(got_two.wait(), 60)
        for server_side in list(instance.hooks.connections):
            server_side.abort()  # the instance vanishes mid-benchmark
        samples = await asyncio.wait_for(task, 30)
        await conn.close()
        return samples

    samples = instance.loop.run_until_complete(go())
    assert len(samples) >= 2 and all(isinstance(s, GpuSample) for s in samples)


def test_stop_set_before_the_first_sample(instance):
    async def go():
        conn = await _connect(instance)
        stop = asyncio.Event()
        stop.set()
        samples = await asyncio.wait_for(sample_gpus(conn, 0.1, stop), 30)
        finished = await _handlers_done(instance.hooks)
        await conn.close()
        return samples, finished

    samples, finished = instance.loop.run_until_complete(go())
    assert samples == [] and finished


def test_gpu_samples_round_trip_through_the_manifest(tmp_path):
    from pytest_gpubench.store.manifest import Manifest

    samples = [GpuSample(t=100.0 + i, gpu=i % 2, utilization_pct=90, memory_used_mib=5000,
                         temperature_c=None, power_draw_w=300.5) for i in range(4)]
    with Manifest(tmp_path / "m.db") as manifest:
        row = manifest.add_cell("run-1", "cell", gpu_type="RTX 4090", provider="vastai", model="qwen2:7b",
                                matrix_file="m.yaml")
        assert manifest.add_gpu_samples(row, None, samples) == 4
        stored = manifest.gpu_samples(row_id=row)
    assert [(s["t"], s["gpu"], s["temperature_c"], s["power_draw_w"]) for s in stored] == [
        (100.0, 0, None, 300.5), (101.0, 1, None, 300.5), (102.0, 0, None, 300.5), (103.0, 1, None, 300.5)]
    assert GpuSample.model_validate({k: v for k, v in stored[0].items() if k in GpuSample.model_fields}) == samples[0]

