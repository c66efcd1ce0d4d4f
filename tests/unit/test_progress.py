"""Tests of pytest_gpubench.store.progress: the seed-000 progress file, written and read back."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from pytest_gpubench.errors import Stage
from pytest_gpubench.store.progress import REDACTED, ProgressWriter, format_value, read_progress
from pytest_gpubench.measure.results import BenchmarkResult, PerformanceResults

KEY = "-----BEGIN " "OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"


class Clock:
    """2026-02-07T10:00:00Z, one second later at every call."""

    def __init__(self) -> None:
        self.now = datetime(2026, 2, 7, 10, 0, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        now, self.now = self.now, self.now + timedelta(seconds=1)
        return now


@pytest.fixture
def path(tmp_path):
    return tmp_path / "progress" / "cell.log"


@pytest.fixture
def writer(path):
    with ProgressWriter(path, clock=Clock()) as w:
        yield w


def test_lines_are_byte_exact(writer, path):
    writer.status("STARTING", gpu="H100", model="llama3:70b", worker="w1")
    writer.status("inventory_query", offers_found=12, selected_offer_id="vastai-12345", price=2.5)
    writer.progress(requests=5, tokens=1250, tps=41.2345, errors=0)
    writer.status("RESULTS_COLLECTED")
    writer.results({"model": "llama3:70b", "avg_tokens_per_second": 41.6})
    writer.status("COMPLETED", tps=41.6, cost=0.5234)
    writer.error(Stage.MODEL_PULL, 'pull failed:\n"disk" full\r\nretry later')
    assert path.read_bytes() == (
        b"[2026-02-07T10:00:00Z] STATUS: STARTING gpu=H100 model=llama3:70b worker=w1\n"
        b"[2026-02-07T10:00:01Z] STATUS: INVENTORY_QUERY offers_found=12"
        b" selected_offer_id=vastai-12345 price=2.50\n"
        b"[2026-02-07T10:00:02Z] PROGRESS: requests=5 tokens=1250 tps=41.2 errors=0\n"
        b"[2026-02-07T10:00:03Z] STATUS: RESULTS_COLLECTED\n"
        b'[2026-02-07T10:00:04Z] RESULTS: {"model":"llama3:70b","avg_tokens_per_second":41.6}\n'
        b"[2026-02-07T10:00:05Z] STATUS: COMPLETED tps=41.6 cost=0.52\n"
        b'[2026-02-07T10:00:06Z] ERROR: stage=model_pull message="pull failed: \\"disk\\" full'
        b' retry later"\n'
    )


def test_methods_return_the_line(writer):
    assert writer.progress(requests=1) == "[2026-02-07T10:00:00Z] PROGRESS: requests=1"


def test_local_clock_is_written_as_utc(path):
    plus_two = timezone(timedelta(hours=2))
    w = ProgressWriter(path, clock=lambda: datetime(2026, 2, 7, 12, 0, 0, tzinfo=plus_two))
    assert w.status("X").startswith("[2026-02-07T10:00:00Z]")
    w.close()


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("price", 2.5, "2.50"),
        ("price_per_hour", 0.4, "0.40"),
        ("cost_usd", 1.23456, "1.23"),
        ("tps", 41.63333, "41.6"),
        ("ttft_ms", 123.456, "123.5"),
        ("error_rate", 0.052631, "0.0526"),
        ("zero", 0.0, "0.0"),
        ("count", 7, "7"),
        ("flag", True, "true"),
        ("missing", None, ""),
        ("stage", Stage.SSH_WAIT, "ssh_wait"),
        ("host", "ssh5.vast.ai", "ssh5.vast.ai"),
        ("message", "two words", '"two words"'),
        ("empty", "", '""'),
        ("quote", 'say "hi"', '"say \\"hi\\""'),
        ("path", "C:\\dir", '"C:\\\\dir"'),
        ("multi", "a\nb", '"a b"'),
        ("key", KEY, REDACTED),
    ],
)
def test_format_value(key, value, text):
    assert format_value(key, value) == text


def test_round_trip(writer, path):
    writer.status("SSH_READY", host="ssh5.vast.ai", port=12345)
    writer.status("NOTE", note='a "quoted" \\ value', empty="", none=None, flag=False,
                  eq="a=b")
    writer.progress(requests=10, tps=42.06)
    writer.error("ssh_connect", "Connection refused")
    result = BenchmarkResult(id="b-1", results=PerformanceResults(avg_tokens_per_second=41.6))
    writer.results(result)

    lines = read_progress(path)
    assert [line.kind for line in lines] == ["STATUS", "STATUS", "PROGRESS", "ERROR", "RESULTS"]
    assert lines[0].timestamp == datetime(2026, 2, 7, 10, 0, 0, tzinfo=timezone.utc)
    assert lines[0].label == "SSH_READY"
    assert lines[0].fields == {"host": "ssh5.vast.ai", "port": "12345"}
    assert lines[1].fields == {"note": 'a "quoted" \\ value', "empty": "", "none": None,
                               "flag": "false", "eq": "a=b"}
    assert lines[2].label is None and lines[2].fields == {"requests": "10", "tps": "42.1"}
    assert lines[3].stage == "ssh_connect" and lines[3].message == "Connection refused"
    assert lines[4].data["id"] == "b-1"
    assert BenchmarkResult.model_validate(lines[4].data) == result
    assert lines[4].raw.startswith("[2026-02-07T10:00:04Z] RESULTS: {")


def test_secrets_are_redacted_everywhere(writer, path):
    writer.status("PROVISIONING", session_id="s-1", key=KEY)
    writer.error(Stage.PROVISION, f"bad response: {KEY}")
    writer.results({"session": {"id": "s-1"}, "ssh_private_key": KEY, "list": [KEY, 1]})
    text = path.read_text()
    assert "PRIVATE KEY" not in text and "-----BEGIN" not in text
    lines = read_progress(path)
    assert lines[0].fields["key"] == REDACTED
    assert lines[1].message == REDACTED
    assert lines[2].data == {"session": {"id": "s-1"}, "ssh_private_key": REDACTED,
                             "list": [REDACTED, 1]}


def test_results_json_is_one_line_and_strict(writer, path):
    writer.results({"text": "line one\nline two", "bad": float("nan"), "ok": 1.5})
    raw = path.read_text()
    assert raw.count("\n") == 1
    assert read_progress(path)[0].data == {"text": "line one\nline two", "bad": None, "ok": 1.5}


def test_invalid_input_is_refused(writer):
    with pytest.raises(ValueError):
        writer.status("not a label")
    with pytest.raises(ValueError):
        writer.progress(**{"bad key": 1})
    with pytest.raises(ValueError):
        writer.error("setup", "not a seed stage")


def test_appends_and_creates_parent_directories(path):
    for _ in range(2):
        with ProgressWriter(path, clock=Clock()) as w:
            w.status("STARTING")
    assert path.parent.is_dir()
    assert len(read_progress(path)) == 2


def test_truncated_last_line_is_dropped(writer, path):
    writer.status("STARTING", gpu="H100")
    writer.progress(requests=1)
    with open(path, "a") as f:
        f.write('[2026-02-07T10:00:09Z] RESULTS: {"model":"llam')
    lines = read_progress(path)
    assert [line.kind for line in lines] == ["STATUS", "PROGRESS"]


def test_complete_unterminated_last_line_is_kept(writer, path):
    writer.status("STARTING")
    with open(path, "a") as f:
        f.write('[2026-02-07T10:00:09Z] ERROR: stage=benchmark message="cut"')
    assert read_progress(path)[-1].message == "cut"


def test_foreign_lines_are_skipped_unless_strict(writer, path):
    writer.status("STARTING")
    with open(path, "a") as f:
        f.write("BENCHMARK_COMPLETE: tps=41.6\n")
    writer.status("DONE")
    assert [line.label for line in read_progress(path)] == ["STARTING", "DONE"]
    with pytest.raises(ValueError, match=":2:"):
        read_progress(path, strict=True)


def test_reads_the_seed_example(tmp_path):
    seed = tmp_path / "seed.log"
    seed.write_text(
        "[2026-02-07T10:00:00] STATUS: STARTING gpu=H100 model=llama3:70b worker=w1\n"
        "[2026-02-07T10:00:05] STATUS: INVENTORY_QUERY offers_found=12"
        " selected_offer_id=vastai-12345 price=2.50\n"
        "[2026-02-07T10:08:00] PROGRESS: requests=5 tokens=1250 tps=41.2 errors=0\n"
        '[2026-02-07T10:13:06] RESULTS: {"model":"llama3:70b","avg_tokens_per_second":41.6,...}\n'
        "[2026-02-07T10:13:12] STATUS: COMPLETED tps=41.6 cost=0.52\n"
    )
    lines = read_progress(seed)
    # The seed's RESULTS line is elided ("...") and so not JSON: skipped.
    assert [line.label for line in lines] == ["STARTING", "INVENTORY_QUERY", None, "COMPLETED"]
    assert lines[1].fields["price"] == "2.50"
    assert lines[0].timestamp == datetime(2026, 2, 7, 10, 0, 0)


def test_threads_never_interleave_lines(path):
    writer = ProgressWriter(path)
    start = threading.Barrier(8)

    def write(n: int) -> None:
        start.wait()
        for i in range(200):
            writer.progress(thread=n, i=i, note="x" * 200)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    lines = read_progress(path, strict=True)
    assert len(lines) == 1600
    assert {(line.fields["thread"], line.fields["i"]) for line in lines} == {
        (str(n), str(i)) for n in range(8) for i in range(200)
    }
