"""``gpubench report --compare`` (issue 23 item 6): the same cells of two runs, or two stores, side by
side with deltas B - A, and whether each delta is beyond the runs' own spread (the 95% intervals of
the per-run means overlap or not); cells on one side only, or measured with another workload, listed
as such; clear errors (exit 2) for an unknown run, a missing store, nothing in common.

The logic (measure/compare.py's figure_delta, workload_differs) is tested on plain values; the stores
are real SQLite manifests filled through the Store API with results built as a run builds them
(repeats.Measurement over load-generator passes, summarize, detailed_metrics, fingerprint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpubench.commands.cli import main
from pytest_gpubench.measure.benchmark import LoadgenPass
from pytest_gpubench.measure.compare import (NO_REPEATS, NO_RUN_VALUES, ONE_SIDE, WITHIN_NOISE, Spread,
                                             figure_delta, fingerprint, server_changes, spread_of, workload_differs)
from pytest_gpubench.measure.metrics import detailed_metrics
from pytest_gpubench.measure.repeats import Measurement
from pytest_gpubench.measure.results import BenchmarkResult, ModelInfo, TestConfig, summarize
from pytest_gpubench.remote.readings import RequestRecord
from pytest_gpubench.report.comparison import compare_sides
from pytest_gpubench.report.gather import build_report
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.sqlite_store import SqliteStore

# ------------------------------------------------------------- the logic, on plain values


def test_a_delta_is_b_minus_a_absolute_and_in_percent_of_a() -> None:
    delta = figure_delta("output_tokens_per_second", 200.0, 230.0, runs_a=1, runs_b=1)
    assert (delta.delta, delta.delta_pct, delta.verdict) == (30.0, pytest.approx(15.0), NO_REPEATS)


def test_disjoint_intervals_are_beyond_the_spread_in_the_figures_own_direction() -> None:
    low, high = Spread(n=3, low=190.0, high=200.0), Spread(n=3, low=220.0, high=240.0)
    faster = figure_delta("output_tokens_per_second", 195.0, 230.0, runs_a=3, runs_b=3, spread_a=low, spread_b=high)
    assert (faster.verdict, faster.better) == ("faster, beyond the spread", True)
    # Higher TTFT is slower; a higher $/M tokens is dearer.
    slower = figure_delta("ttft_p50_ms", 195.0, 230.0, runs_a=3, runs_b=3, spread_a=low, spread_b=high)
    assert (slower.verdict, slower.better) == ("slower, beyond the spread", False)
    dearer = figure_delta("cost_per_million_tokens", 195.0, 230.0, runs_a=3, runs_b=3, spread_a=low, spread_b=high)
    assert dearer.verdict == "dearer, beyond the spread"
    cheaper = figure_delta("cost_per_million_tokens", 230.0, 195.0, runs_a=3, runs_b=3, spread_a=high, spread_b=low)
    assert (cheaper.verdict, cheaper.better) == ("cheaper, beyond the spread", True)


def test_overlapping_intervals_are_within_noise_whatever_the_delta() -> None:
    a, b = Spread(n=3, low=190.0, high=210.0), Spread(n=3, low=205.0, high=260.0)
    delta = figure_delta("output_tokens_per_second", 200.0, 232.0, runs_a=3, runs_b=3, spread_a=a, spread_b=b)
    assert (delta.verdict, delta.better, delta.delta) == (WITHIN_NOISE, None, 32.0)


def test_without_repeats_or_per_run_values_the_spread_is_unknown_and_one_sided_values_have_no_delta() -> None:
    assert figure_delta("tpot_p50_ms", 10.0, 9.0, runs_a=3, runs_b=1).verdict == NO_REPEATS
    assert figure_delta("joules_per_output_token", 1.0, 0.8, runs_a=3, runs_b=3).verdict == NO_RUN_VALUES
    one = figure_delta("joules_per_output_token", None, 0.8, runs_a=3, runs_b=3)
    assert (one.verdict, one.delta, one.delta_pct) == (ONE_SIDE, None, None)


def test_the_spread_is_the_bootstrap_interval_of_the_mean_and_needs_two_runs() -> None:
    spread = spread_of([100.0, 104.0, None, 102.0])
    assert spread is not None and spread.n == 3 and 100.0 <= spread.low < 102.0 < spread.high <= 104.0
    assert spread_of([100.0]) is None and spread_of([None, 5.0]) is None


def _print(version: str = "0.6.3", max_tokens: int = 64, args: tuple[str, ...] = ()):
    return fingerprint(prompts=["p"], max_tokens=max_tokens, concurrency=4, rate=None, think=None, warmup_requests=1,
                       runtime="vllm", runtime_version=version, launch_args=args)


def test_a_new_server_version_or_flags_are_the_same_workload_and_said_but_another_workload_is_not() -> None:
    assert workload_differs(_print("0.6.3"), _print("0.7.0", args=("--enable-prefix-caching",))) is None
    assert server_changes(_print("0.6.3"), _print("0.7.0")) == "runtime vllm 0.6.3 -> vllm 0.7.0"
    assert workload_differs(_print(), _print(max_tokens=128)) == "max_tokens 64 -> 128"
    assert workload_differs(None, _print()) == "run A's result stored no workload fingerprint, so its workload is unknown"


# ------------------------------------------------------------ real stores, built as a run builds them

#: Per-stream decode rates of each repeated run; every cell runs 4 streams of 20 requests per run.
SLOW, FAST, NOISY = (50.0, 50.5, 49.5), (60.0, 60.5, 59.5), (45.0, 58.0, 52.0)


def _records(run: int, rate: float, ttft_ms: float, requests: int = 8, tokens: int = 33) -> list[RequestRecord]:
    decode_ms = (tokens - 1) / rate * 1000
    return [RequestRecord(index=i, prompt_index=i % 2, started_at=run * 100.0 + i, ttft_ms=ttft_ms + i % 3,
                          latency_ms=ttft_ms + decode_ms, output_tokens=tokens, tokens_per_second=rate,
                          tpot_ms=1000 / rate) for i in range(requests)]


def _add_cell(store: SqliteStore, run_id: str, model: str, rates: tuple[float, ...], *, version: str = "0.6.3",
              max_tokens: int = 64, price: float = 2.0) -> None:
    row = store.add_cell(run_id, f"H100-vastai-{model}-runtime_vllm-c4", gpu_type="H100", provider="vastai",
                         model=model, matrix_file="gpubench_m.yaml")
    measurement = Measurement()
    for index, rate in enumerate(rates):
        records = _records(index, rate, ttft_ms=4000 / rate)
        measurement.add(LoadgenPass(records=records, duration_seconds=8 * 32 / rate / 4, status="done"), [], index)
    duration = measurement.duration_seconds
    stats = measurement.statistics()
    result = BenchmarkResult(test_config=TestConfig(concurrent_reqs=4, max_tokens=max_tokens), provider="vastai",
                             price_per_hour=price, model=ModelInfo(name=model, runtime="vllm", runtime_version=version),
                             results=summarize(measurement.records, duration))
    result_id = store.add_result(row, result, measurement.records)
    store.set_result_details(result_id, {
        "metrics": detailed_metrics(measurement.records, duration).model_dump(mode="json"),
        "runs": measurement.runs, "run_statistics": stats.model_dump(mode="json") if stats else None,
        "load": {"concurrency": 4, "rate": None},
        "runtime": {"name": "vllm", "version": version},
        "fingerprint": _print(version, max_tokens).model_dump(mode="json")})
    store.finish_cell(row, status="success")


def _store(path: Path, runs: dict[str, list[tuple]]) -> Path:
    with Manifest(path) as manifest:
        store = SqliteStore(manifest)
        for run_id, cells in runs.items():
            store.start_run(run_id, ["pytest"], [])
            for model, rates, options in cells:
                _add_cell(store, run_id, model, rates, **options)
            store.finish_run(run_id, "done")
    return path


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    return _store(tmp_path / "manifest.db", {
        "run-old": [("qwen2:7b", SLOW, {}), ("llama3:8b", SLOW, {}), ("gone:1b", SLOW, {}),
                    ("other:3b", SLOW, {})],
        "run-new": [("qwen2:7b", FAST, {"version": "0.7.0"}), ("llama3:8b", NOISY, {"version": "0.7.0"}),
                    ("fresh:1b", (70.0,), {}), ("other:3b", SLOW, {"max_tokens": 128})]})


def _compare(path: Path):
    with Manifest(path) as manifest:
        store = SqliteStore(manifest)
        return compare_sides(store, build_report(store, ["run-old"]).results, store,
                             build_report(store, ["run-new"]).results, label_a="run run-old", label_b="run run-new")


def test_two_stored_runs_compare_cell_by_cell_with_verdicts_from_their_repeats(two_runs: Path) -> None:
    comparison = _compare(two_runs)
    cells = {cell.cell.split(" on ")[0]: cell for cell in comparison.cells}
    assert sorted(cells) == ["llama3:8b", "qwen2:7b"]
    qwen = cells["qwen2:7b"]
    assert (qwen.runs_a, qwen.runs_b, qwen.server_change) == (3, 3, "runtime vllm 0.6.3 -> vllm 0.7.0")
    figures = {delta.figure: delta for delta in qwen.figures}
    output = figures["output_tokens_per_second"]
    # 4 streams at 50 tokens/s against 60: +20%, and the runs' intervals are far apart.
    assert output.delta_pct == pytest.approx(20.0, abs=0.5)
    assert output.verdict == "faster, beyond the spread"
    assert figures["ttft_p50_ms"].verdict == "faster, beyond the spread"  # 80 ms -> 67 ms
    assert figures["tpot_p50_ms"].verdict == "faster, beyond the spread"  # per-run, from the stored requests
    assert figures["ttft_p95_ms"].spread_a is not None
    assert figures["cost_per_million_tokens"].verdict == "cheaper, beyond the spread"
    # The noisy new run's range (45..58) holds the old one's: within noise.
    llama = {delta.figure: delta for delta in cells["llama3:8b"].figures}
    assert llama["output_tokens_per_second"].verdict == WITHIN_NOISE
    assert comparison.only_a == ["gone:1b on H100 / vastai / vllm (c4)"]
    assert comparison.only_b == ["fresh:1b on H100 / vastai / vllm (c4)"]
    (other,) = comparison.incomparable
    assert (other.cell, other.why) == ("other:3b on H100 / vastai / vllm (c4)", "max_tokens 64 -> 128")


def test_the_command_prints_writes_markdown_html_and_json(two_runs: Path, tmp_path: Path, capsys) -> None:
    reports = tmp_path / "reports"
    code = main(["report", "--store", str(two_runs), "--reports", str(reports), "--compare", "run-old", "last"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("Comparison: A = run run-old, B = run run-new.") and "faster, beyond the spread" in out and "within noise" in out
    assert "only in A: gone:1b" in out and "not comparable: other:3b" in out
    markdown = (reports / "BENCHMARK_REPORT.md").read_text()
    assert markdown.index("## Comparison") < markdown.index("## Headline findings")
    html = (reports / "index.html").read_text()
    assert '<h2 id="comparison">Comparison</h2>' in html and 'data-table="comparison"' in html
    data = json.loads((reports / "comparison.json").read_text())
    assert (data["a"], data["b"]) == ("run run-old", "run run-new")
    assert [cell["cell"].split(" on ")[0] for cell in data["cells"]] == ["llama3:8b", "qwen2:7b"]


def test_two_stores_compare_their_latest_results(tmp_path: Path, capsys) -> None:
    before = _store(tmp_path / "before.db", {"run-1": [("qwen2:7b", SLOW, {})]})
    after = _store(tmp_path / "after.db", {"run-9": [("qwen2:7b", FAST, {"version": "0.7.0"})]})
    code = main(["report", "--reports", str(tmp_path / "r"), "--compare-stores", str(before), str(after)])
    out = capsys.readouterr().out
    assert code == 0 and f"A = store {before}, B = store {after}" in out
    assert "qwen2:7b on H100 / vastai / vllm (c4) (runtime vllm 0.6.3 -> vllm 0.7.0)" in out


@pytest.mark.parametrize("argv, message", [
    (["--compare", "run-old", "run-nope"], "no run 'run-nope' in the manifest"),
    (["--compare", "run-old", "run-old"], "--compare names run run-old twice"),
    (["--compare-stores", "MISSING", "{store}"], "no manifest at MISSING"),
    (["--compare", "run-old", "run-new", "--run", "last"], "--run does not go with --compare"),
])
def test_bad_arguments_are_one_line_and_exit_2(two_runs: Path, tmp_path: Path, capsys, argv, message) -> None:
    argv = [arg.replace("MISSING", str(tmp_path / "missing.db")).replace("{store}", str(two_runs)) for arg in argv]
    message = message.replace("MISSING", str(tmp_path / "missing.db"))
    code = main(["report", "--store", str(two_runs), "--reports", str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    if "run-nope" in message:
        assert "runs available, most recent first: run-new, run-old" in err


def test_nothing_in_common_names_what_each_side_has(tmp_path: Path, capsys) -> None:
    path = _store(tmp_path / "m.db", {"run-a": [("qwen2:7b", SLOW, {})], "run-b": [("llama3:8b", SLOW, {})]})
    code = main(["report", "--store", str(path), "--reports", str(tmp_path / "r"), "--compare", "run-a", "run-b"])
    err = capsys.readouterr().err
    assert code == 2
    assert ("nothing in common to compare between run run-a and run run-b: run run-a has 1 measured cell(s) "
            "(qwen2:7b on H100 / vastai / vllm (c4)), run run-b has 1 (llama3:8b on H100 / vastai / vllm (c4))") in err
