"""A microbenchmark cell's figures: the script's events as statistics, and their % of peak.

``remote/microbench.py`` returns the events ``remote/microbench_script.py`` printed; here
each ``figure`` event (one value per timed run) becomes a :class:`MicrobenchFigure` with
the runs' :class:`~.results.RunStatistics` (mean, sample std, CV, Tukey outliers, bootstrap
CI), and each ``skipped`` event a figure without statistics but with its reason. The
figure a report shows is the mean of the runs; its % of peak uses :mod:`.gpu_peaks`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from .gpu_peaks import peaks_for, percent_of_peak
from .results import RunStatistics

__all__ = ["MicrobenchFigure", "MicrobenchRun", "figures_from_events"]

UNITS = {"memory_bandwidth": "GB/s", "matmul": "TFLOPS"}


class MicrobenchFigure(BaseModel):
    """One measured figure of a GPU (memory bandwidth, or matmul throughput at a precision)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    #: The matmul's precision (``fp16``...); None for memory bandwidth.
    precision: str | None = None
    unit: str
    #: The timed runs' statistics; None when the figure was skipped.
    stats: RunStatistics | None = None
    #: Why it was not measured (the GPU's compute capability, or what torch said).
    skipped: str | None = None

    @property
    def label(self) -> str:
        """``memory_bandwidth`` or ``matmul_fp16``: the figure's name in reports and the store."""
        return self.kind if self.precision is None else f"{self.kind}_{self.precision}"

    @property
    def value(self) -> float | None:
        """The figure: the mean over the timed runs (None when skipped)."""
        return self.stats.mean if self.stats is not None else None

    def percent_of_peak(self, gpu: str) -> float | None:
        """The mean as a % of ``gpu``'s datasheet peak (:mod:`.gpu_peaks`); None if no peak is known."""
        peaks = peaks_for(gpu)
        return percent_of_peak(self.value, peaks.peak(self.kind, self.precision) if peaks else None)


class MicrobenchRun(BaseModel):
    """Everything one microbenchmark cell measured, and on what."""

    model_config = ConfigDict(frozen=True)

    device: str = ""
    capability: str = ""
    torch_version: str = ""
    #: ``CUDA_VISIBLE_DEVICES`` the script ran with (the leased GPU on a shared machine); "": every GPU.
    visible_devices: str = ""
    figures: tuple[MicrobenchFigure, ...] = ()


def figures_from_events(events: list[dict[str, Any]]) -> MicrobenchRun:
    """The script's events as a :class:`MicrobenchRun` (figures in the order measured).

    A ``figure`` event without a single finite value is kept as skipped, with that said,
    rather than averaged as 0.
    """
    device: dict[str, Any] = next((e for e in events if e.get("event") == "device"), {})
    figures = []
    for event in events:
        kind, precision = event.get("kind"), event.get("precision")
        if event.get("event") == "skipped":
            figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=UNITS.get(kind, ""),
                                            skipped=str(event.get("reason") or "not measured")))
        elif event.get("event") == "figure":
            unit = str(event.get("unit") or UNITS.get(kind, ""))
            try:
                stats = RunStatistics.from_values(event.get("values") or [])
            except ValueError as exc:
                figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=unit,
                                                skipped=f"no usable run: {exc}"))
                continue
            figures.append(MicrobenchFigure(kind=kind, precision=precision, unit=unit, stats=stats))
    capability = device.get("capability") or []
    return MicrobenchRun(device=str(device.get("name") or ""),
                         capability=".".join(str(part) for part in capability),
                         torch_version=str(device.get("torch") or ""),
                         visible_devices=str(device.get("visible_devices") or ""), figures=tuple(figures))
