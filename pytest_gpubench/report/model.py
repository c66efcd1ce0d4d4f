"""The report's model: everything ``gpubench report`` shows, in display order.

:func:`.gather.build_report` fills it from the manifest; :mod:`.markdown` and
:mod:`.html` render it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ..matrix.fields import DEFAULT_RUNTIME
from ..measure.frontier import FrontierPoint
from ..remote.sysinfo import SystemInfo
from ..store.records import SystemRecord
from ..store.records import report_note, report_title
from .frontier import FrontierGroup

__all__ = ["BestValue", "FailureGroup", "MachineRow", "Matchup", "MicrobenchRow", "ModelTable", "ProviderWins", "Report", "ResultRow",
           "RunSpend"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class ResultRow(_Frozen):
    """One measured cell: the figures the report shows for it."""

    run_id: str
    cell_id: str
    benchmark_id: str
    #: The GPU as the report names it: ``RTX 4090``, ``2x RTX 4090`` for a cell on two (:attr:`gpus`).
    gpu: str
    provider: str
    model: str
    #: GPUs of one machine the cell spanned; its price (and so its $/M tokens) is the whole machine's.
    gpus: int = 1
    #: The server that served it (the result's ``model.runtime``), `` (entrypoint)`` added when
    #: GPU Shopper's image started it: another runtime is another measurement of the same model.
    runtime: str = DEFAULT_RUNTIME
    concurrency: int | None = None
    rate: float | None = None
    status: str
    #: The headline figure: output throughput, or the per-request decode rate when a
    #: result (an imported one) has no token total or duration (``per_stream_only``).
    output_tokens_per_second: float | None
    decode_tokens_per_second: float | None
    per_stream_only: bool = False
    ttft_p50_ms: float | None
    price_per_hour: float | None
    cost_per_million_tokens: float | None
    requests: int
    errors: int
    location: str = ""
    #: False: the figures do not describe the GPU (docs/metrics.md, validity flags).
    valid: bool | None = None
    invalid_because: str = ""
    finished_at: str = ""
    #: Every registered figure of the result (:mod:`.figures`), by name; None where not measured.
    figures: dict[str, Any] = {}
    #: A ``rate: sweep`` cell's sweep (the result's ``details["sweep"]``); None for a cell at one load.
    saturation: dict[str, Any] | None = None
    #: Its frontier points (report/frontier.py, ``stored_points``) and where they came from
    #: (``frontier`` or ``metrics``), and why its sweep stopped.
    points: list[FrontierPoint] = []
    points_source: str = ""
    stop_reason: str = ""
    #: The workload it ran (prompts, max_tokens ... of its fingerprint): results of one model compare
    #: only within one workload. "": not recorded (older results).
    workload: str = ""
    workload_label: str = ""
    #: Seconds its cell spent in provision, SSH, runtime setup and model pull (paid once per session).
    setup_seconds: float | None = None
    #: Target interactivities its stored SLO implies (1000 / tpot_ms).
    slo_targets: list[float] = []

    @property
    def load(self) -> str:
        """``c1``, ``c8``, ``r2.5/s`` or ``sweep``: the load the cell ran at."""
        if self.saturation is not None:
            return "sweep"
        if self.rate is not None:
            return f"r{self.rate:g}/s"
        return f"c{self.concurrency or 1}"

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What makes two results the same cell, across runs."""
        return (self.gpu, self.provider, self.model, self.runtime, self.load)

    @property
    def served_by(self) -> str:
        """``vllm`` for a runtime other than the default, else "": how labels name it."""
        return "" if self.runtime == DEFAULT_RUNTIME else self.runtime

    @property
    def machine(self) -> str:
        """``RTX 4090 / vastai``, then ``/ vllm`` for a runtime other than the default."""
        return f"{self.gpu} / {self.provider}" + (f" / {self.served_by}" if self.served_by else "")

    @property
    def label(self) -> str:
        """:attr:`machine`, with the load when it is not the default."""
        return self.machine + ("" if self.load == "c1" else f" ({self.load})")


class ModelTable(_Frozen):
    """The results of one model, fastest first, and its two picks."""

    model: str
    rows: list[ResultRow]
    fastest: ResultRow
    cheapest: ResultRow | None


class BestValue(_Frozen):
    """The GPU and provider with the lowest $/M tokens on the most models."""

    gpu: str
    provider: str
    cheapest_on: int  # models it is the cheapest for
    models: int  # models it ran


class Matchup(_Frozen):
    """Two or more providers measured on the same GPU, model, runtime and load."""

    gpu: str
    model: str
    runtime: str = DEFAULT_RUNTIME
    load: str
    entries: list[ResultRow]
    faster: str
    cheaper: str | None


class ProviderWins(_Frozen):
    """How one provider fared in the head-to-heads it was part of."""

    provider: str
    faster: int
    cheaper: int
    matchups: int


class FailureGroup(_Frozen):
    """Cells that ended at the same stage with the same message."""

    stage: str
    message: str
    count: int
    cells: list[str]


class MicrobenchRow(_Frozen):
    """One GPU microbenchmark figure of a GPU and provider (``gather.microbench_rows`` gathers them)."""

    run_id: str
    gpu: str
    provider: str
    label: str  # memory_bandwidth, matmul_fp16, ...
    unit: str
    #: The mean of the timed runs, with its 95% confidence interval; None when skipped.
    value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    runs: int = 0
    skipped: str = ""
    #: The datasheet peak (measure/microbench.py) and the figure as a % of it; None when unknown.
    peak: float | None = None
    percent_of_peak: float | None = None
    #: The best output tok/s of the same GPU in this report, and the model and provider that reached it.
    best_llm_tokens_per_second: float | None = None
    best_llm: str = ""


class MachineRow(BaseModel):
    """One machine: its GPUs (the first one's figures: the cell's GPUs are alike) and its host."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str
    provider: str
    #: Which of the provider's machines (the offer's machine id; a host's name); "": unknown.
    machine: str = ""
    gpu_name: str
    gpu_count: int
    memory_mib: int | None
    compute_capability: str
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    power_limit_w: float | None
    driver_version: str
    cuda_version: str
    cpu_model: str
    cpu_cores: int
    ram_mib: int | None
    os: str
    kernel: str
    disk_total_bytes: int | None
    disk_free_bytes: int | None
    #: Which source answered: ``nvml``, ``nvidia-smi-xml`` or ``nvidia-smi-csv``.
    source: str
    #: Sessions detected on such a machine.
    sessions: int = 1

    @classmethod
    def of(cls, record: SystemRecord, sessions: int = 1) -> MachineRow:
        system: SystemInfo = record.system
        gpu, host = system.first, system.host
        return cls(
            gpu_type=record.gpu_type, provider=record.provider, machine=record.machine,
            gpu_name=gpu.name if gpu else "",
            gpu_count=len(system.gpus), memory_mib=gpu.memory_total_mib if gpu else None,
            compute_capability=gpu.compute_capability if gpu else "",
            sm_clock_max_mhz=gpu.sm_clock_max_mhz if gpu else None,
            mem_clock_max_mhz=gpu.mem_clock_max_mhz if gpu else None,
            power_limit_w=gpu.power_limit_w if gpu else None, driver_version=system.driver_version,
            cuda_version=system.cuda_version, cpu_model=host.cpu_model, cpu_cores=host.cpu_cores,
            ram_mib=host.ram_mib, os=host.os, kernel=host.kernel, disk_total_bytes=host.disk_total_bytes,
            disk_free_bytes=host.disk_free_bytes, source=system.source, sessions=sessions,
        )

    @property
    def provider_label(self) -> str:
        """The provider and, when known and not its own name, the machine: ``hosts (lab1)``."""
        return f"{self.provider} ({self.machine})" if self.machine and self.machine != self.provider \
            else self.provider

    @property
    def identity(self) -> tuple[object, ...]:
        """What makes two sessions the same machine (the disk's free space does not)."""
        return (self.gpu_type, self.provider, self.machine, self.gpu_name, self.gpu_count, self.memory_mib,
                self.compute_capability, self.sm_clock_max_mhz, self.mem_clock_max_mhz, self.power_limit_w,
                self.driver_version, self.cuda_version, self.cpu_model, self.cpu_cores, self.ram_mib, self.os,
                self.kernel, self.source)


class RunSpend(BaseModel):
    """One run's cells and money."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    started_at: str
    finished_at: str
    status: str
    cells: int
    statuses: dict[str, int]
    sessions: int
    #: Billed session time (price x lifetime), each session once; see :func:`.gather.run_spend`.
    spent_usd: float
    #: The cells' ``cost_usd`` summed: their shares of the sessions they ran on.
    cells_cost_usd: float
    #: ``attempts`` or ``cells`` (a run without attempt rows, such as an imported one).
    spent_from: str
    #: Sessions with no recorded end: their cost is counted up to ``as_of``.
    open_sessions: int
    as_of: str


class Report(_Frozen):
    """Everything a report says, in display order; built by :func:`build_report`."""

    manifest: str
    run_ids: list[str]
    results: list[ResultRow]
    #: Results of a cell that a later (or successful) result of the same cell replaced.
    replaced: int
    runs_combined: int
    by_tokens: list[ResultRow]
    by_cost: list[ResultRow]
    models: list[ModelTable]
    best_value: BestValue | None
    matchups: list[Matchup]
    provider_wins: list[ProviderWins]
    failures: list[FailureGroup]
    skipped: list[FailureGroup]
    statuses: dict[str, int]
    runs: list[RunSpend]
    data_until: str
    #: Runs that measured the sandbox (``runs.sandbox``): their figures are labelled so.
    sandbox_runs: list[str] = []
    #: The machines the runs measured on, as system detection found them (:func:`.gather.machines`).
    machines: list[MachineRow] = []
    #: GPU microbenchmark figures, latest per GPU, provider and figure (docs/hardware.md).
    microbench: list[MicrobenchRow] = []
    #: The frontiers across cells, one per model and workload (docs/report.md, "Frontiers").
    frontiers: list[FrontierGroup] = []
    #: The target interactivities the user set (``--target-interactivity``); () : the stored SLOs'.
    targets: tuple[float, ...] = ()

    @property
    def title(self) -> str:
        """``GPU Benchmark Report``, marked when sandbox runs are in it."""
        return report_title(self.sandbox_runs, self.run_ids)

    @property
    def sandbox_note(self) -> str:
        """What sandbox figures are, when any run in the report used the sandbox; else ""."""
        return report_note(self.sandbox_runs, self.run_ids)

    @property
    def cells(self) -> int:
        return sum(self.statuses.values())

    @property
    def spent_usd(self) -> float:
        return sum(run.spent_usd for run in self.runs)

    @property
    def sessions(self) -> int:
        return sum(run.sessions for run in self.runs)

    @property
    def gpus(self) -> list[str]:
        return sorted({row.gpu for row in self.results})

    @property
    def providers(self) -> list[str]:
        return sorted({row.provider for row in self.results})

    def describe(self) -> str:
        """One line for the terminal: ``5 results from 2 of 3 runs, 3 failed or partial cells``."""
        failed = sum(group.count for group in self.failures)
        return (f"{len(self.results)} result{'s' * (len(self.results) != 1)} from {self.runs_combined} of "
                f"{len(self.run_ids)} run{'s' * (len(self.run_ids) != 1)}, "
                f"{failed} failed or partial cell{'s' * (failed != 1)}")
