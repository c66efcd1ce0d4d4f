from pytest_gpubench.run.live import LiveProgress
from pytest_gpubench.store.progress import ProgressWriter
from pytest_gpubench.report.summary_table import SummaryTable


def test_live_progress_prints_only_new_complete_lines(tmp_path):
    shown = []
    live = LiveProgress(tmp_path, shown.append)
    writer = ProgressWriter(tmp_path / "RTX_4090-vastai-qwen2_7b.log")
    writer.status("PROVISIONING", session_id="s1")
    writer.progress(stage="model_pull", pct=40)
    writer.results({"avg_tokens_per_second": 1.0})  # not shown: too long for a live line
    assert live.poll() == [
        "gpubench RTX_4090-vastai-qwen2_7b: STATUS: PROVISIONING session_id=s1",
        "gpubench RTX_4090-vastai-qwen2_7b: PROGRESS: stage=model_pull pct=40",
    ]
    assert live.poll() == []
    with open(tmp_path / "RTX_4090-vastai-qwen2_7b.log", "a") as handle:
        handle.write("[2026-01-01T00:00:00Z] PROGRESS: requests=3")  # half-written line
    assert live.poll() == []
    with open(tmp_path / "RTX_4090-vastai-qwen2_7b.log", "a") as handle:
        handle.write(" tps=41.5\n")
    assert live.poll() == ["gpubench RTX_4090-vastai-qwen2_7b: PROGRESS: requests=3 tps=41.5"]
    assert shown[-1].endswith("tps=41.5")


def test_live_progress_shows_only_what_is_written_after_it_starts(tmp_path):
    """A resumed run appends to its cells' progress files: the earlier lines are not news."""
    old = ProgressWriter(tmp_path / "RTX_3090-vastai-qwen2_7b.log")
    old.status("STARTING", run="r1")
    old.error("results", "min_tps: measured 167.7 tok/s")
    old.close()
    shown = []
    live = LiveProgress(tmp_path, shown.append)
    assert live.poll() == []
    again = ProgressWriter(tmp_path / "RTX_3090-vastai-qwen2_7b.log")
    again.status("STARTING", run="r1")
    new = ProgressWriter(tmp_path / "RTX_4090-vastai-qwen2_1.5b.log")  # a file that appears later: all of it
    new.status("STARTING", run="r1")
    assert live.poll() == ["gpubench RTX_3090-vastai-qwen2_7b: STATUS: STARTING run=r1",
                           "gpubench RTX_4090-vastai-qwen2_1.5b: STATUS: STARTING run=r1"]
    (tmp_path / "RTX_4090-vastai-qwen2_1.5b.log").write_text("[2026-01-01T00:00:00Z] STATUS: X\n")  # written anew
    assert live.poll() == ["gpubench RTX_4090-vastai-qwen2_1.5b: STATUS: X"]
    assert shown == ["gpubench RTX_3090-vastai-qwen2_7b: STATUS: STARTING run=r1",
                     "gpubench RTX_4090-vastai-qwen2_1.5b: STATUS: STARTING run=r1",
                     "gpubench RTX_4090-vastai-qwen2_1.5b: STATUS: X"]


def test_live_progress_prints_each_line_once_when_polled_from_two_threads(tmp_path):
    shown = []
    live = LiveProgress(tmp_path, shown.append, interval=0.001)
    writer = ProgressWriter(tmp_path / "cell.log")
    live.start()
    try:
        for n in range(300):
            writer.progress(requests=n)
            live.poll()  # what the report hook does, while the follower thread polls too
    finally:
        live.stop()
    assert shown == [f"gpubench cell: PROGRESS: requests={n}" for n in range(300)]


def test_summary_table_rows_totals_and_dashes():
    table = SummaryTable()
    table.add({"gpubench_cell": "b-cell", "gpubench_status": "failed", "gpubench_failure_stage": "ssh_wait",
               "gpubench_cost_usd": 0.01})
    table.add({"gpubench_cell": "a-cell", "gpubench_status": "success", "gpubench_output_tokens_per_second": 650.5,
               "gpubench_decode_tokens_per_second": 178.94, "gpubench_ttft_p50_ms": 61.2,
               "gpubench_cost_per_million_tokens": 0.8541, "gpubench_cost_usd": 0.002})
    table.add({"unrelated": 1})
    lines = table.render()
    # Both tokens/s figures, each named for what it is (docs/metrics.md).
    assert lines[0].split() == ["cell", "status", "output", "tok/s", "decode", "tok/s", "TTFT", "p50", "ms", "$/M",
                                "tokens", "cost", "$"]
    assert lines[1].split() == ["a-cell", "success", "650.5", "178.9", "61", "0.85", "0.0020"]
    assert lines[2].split() == ["b-cell", "failed", "(ssh_wait)", "-", "-", "-", "-", "0.0100"]
    assert lines[-1] == "1 failed, 1 success; spent $0.0120"


def test_own_line_ends_the_line_pytest_left_open(pytester):
    """After a line written mid-run (pytest then no longer knows its file's line is open),
    the letters (and "[100%]", without -s) go on a line with no path; what follows must
    not stick to it."""
    pytester.makeconftest('''
        from pytest_gpubench.run.live import own_line

        def pytest_runtest_setup(item):
            item.config.pluginmanager.get_plugin("terminalreporter").write_line("mid-run line")

        def pytest_sessionfinish(session):
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            own_line(session.config, reporter, "after the letters")
            reporter.write("partial")
            own_line(session.config, reporter, "after a partial line")
    ''')
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("-s", "-p", "no:gpubench")
    lines = result.stdout.lines
    assert "after the letters" in lines and "after a partial line" in lines, lines
    assert "." in lines, "\n".join(lines)  # the letter alone: plain write_line gives ".after the letters"
