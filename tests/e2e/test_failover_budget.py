"""Issue 4: provisioning failover, the template-aware SSH wait, and the spend cap.

Unit tests of the rules (next offer, SSH wait, budget arithmetic), the manifest's
budget transaction raced by real processes, and end-to-end runs on the sandbox
with one fault per failure mode of seed 001.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
import traceback
from datetime import datetime, timedelta, timezone

import httpx
import pytest
import sqlite_utils
from e2e_helpers import SANDBOX_AUTH, SANDBOX_TOKEN, assert_every_session_released, run_pytest, sandbox_sessions

from pytest_gpubench.aio import run as run_async
from pytest_gpubench.cloud.budget import (
    Spend,
    admission,
    exhausted,
    expected_session_seconds,
    refusal,
    skipped_by_budget,
    spend_of,
    summary_line,
)
from pytest_gpubench.errors import ApiError, MatrixError, Stage, StageError, UsageProblem
from pytest_gpubench.store.manifest import Manifest
from pytest_gpubench.store.records import AttemptRecord
from pytest_gpubench.store.sqlite_store import SqliteStore
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.cloud.offers import next_offer
from pytest_gpubench.cloud.provider import Constraints, Offer
from pytest_gpubench.store.progress import read_progress
from pytest_gpubench.cloud.shopper_provider import ShopperProvider
from pytest_gpubench.run.provisioning import Provisioning, can_fail_over
from pytest_gpubench.run.record import CellRecorder
from pytest_gpubench.run.run_context import RunContext
from pytest_gpubench.settings import resolve
from pytest_gpubench.cloud.shopper_client import ShopperClient
from pytest_gpubench.cloud.ssh_wait import ssh_wait_for

TIME_SCALE = 0.01  # the in-process sandbox of tests/e2e/conftest.py
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def offer(offer_id: str, location: str, machine: str | None = None, price: float = 0.1) -> Offer:
    return Offer(id=offer_id, provider="vastai", gpu_type="RTX 3090", vram_gb=24, price_per_hour=price,
                 location=location, machine_id=machine)


# -------------------------------------------------------------------------- options


def test_max_attempts_and_budget_options_resolve_and_validate():
    settings = resolve({"max_attempts": "5"}, {"GPUBENCH_BUDGET": "12.5"}, lambda name: None)
    assert settings.max_attempts == 5 and settings.budget == 12.5
    defaults = resolve({}, {}, lambda name: None)
    assert defaults.max_attempts is None and defaults.budget is None  # the matrix's max_attempts, no cap
    with pytest.raises(UsageProblem, match=r"--gpubench-max-attempts: '0' must be a whole number from 1 to 10"):
        resolve({"max_attempts": "0"}, {}, lambda name: None)
    with pytest.raises(UsageProblem, match=r"environment variable GPUBENCH_BUDGET: '-3' must be a positive"):
        resolve({}, {"GPUBENCH_BUDGET": "-3"}, lambda name: None)


def test_matrix_offer_max_attempts_and_template():
    (row_file, row_own) = expand(parse_matrix(
        "offer: {max_attempts: 2, template: abc}\n"
        "matrix:\n"
        "  - {gpu: RTX 4090, provider: vastai, model: qwen2:7b}\n"
        "  - {gpu: RTX 3090, provider: vastai, model: qwen2:7b, offer: {max_attempts: 1, template: null}}\n",
        "gpubench_m.yaml"))
    assert (row_file.offer.max_attempts, row_file.offer.template) == (2, "abc")
    assert (row_own.offer.max_attempts, row_own.offer.template) == (1, None)
    (default,) = expand(parse_matrix("matrix: [{gpu: RTX 4090, provider: vastai, model: qwen2:7b}]", "m.yaml"))
    assert default.offer.max_attempts == 3 and default.offer.template is None
    with pytest.raises(MatrixError, match=r"offer.max_attempts: must be a whole number from 1 to 10; got 11"):
        parse_matrix("offer: {max_attempts: 11}\nmatrix: [{gpu: RTX 4090, provider: vastai, model: qwen2:7b}]",
                     "m.yaml")
    with pytest.raises(MatrixError, match=r"offer.template: must be a template hash id"):
        parse_matrix("offer: {template: 'a; rm -rf /'}\nmatrix: [{gpu: RTX 4090, provider: vastai, model: x:7b}]",
                     "m.yaml")


# ----------------------------------------------------------------------- next offer


def test_next_offer_skips_failed_ones_and_prefers_another_place_and_machine():
    spain_1, spain_2 = offer("a", "Spain, ES", "m1", 0.08), offer("b", "Spain, ES", "m2", 0.09)
    quebec = offer("c", "Quebec, CA", "m1", 0.10)
    texas = offer("d", "Texas, US", "m3", 0.14)
    eligible = [spain_1, spain_2, quebec, texas]  # select_offer's order: cheapest first
    # Spain's machine m1 failed: same place (b) and same machine (c) are both passed over for Texas.
    assert next_offer(eligible, [spain_1]) is texas
    # With Texas gone too, a new machine in a failed place beats a failed machine elsewhere.
    assert next_offer(eligible, [spain_1, texas]) is spain_2
    assert next_offer(eligible, [spain_1, texas, spain_2]) is quebec
    assert next_offer(eligible, eligible) is None


def test_next_offer_keeps_the_seed_order_among_equally_new_offers():
    eligible = [offer("a", "X"), offer("b", "Y"), offer("c", "Z")]
    assert next_offer(eligible, [offer("old", "W")]).id == "a"
    assert next_offer(eligible, [eligible[0]]).id == "b"


def test_which_errors_fail_over():
    assert can_fail_over(ApiError(Stage.PROVISION, 503, "stale", error_type="stale_inventory"))
    assert can_fail_over(ApiError(Stage.PROVISION, 500, "failed to create instance: No available public IPs"))
    assert can_fail_over(ApiError(Stage.PROVISION, 404, "offer not found"))
    assert can_fail_over(StageError(Stage.SSH_WAIT, "session s still provisioning after 600 s"))
    assert can_fail_over(StageError(Stage.PROVISION, "session s failed: No available public IPs"))
    # Too little disk, a bad workload type: every offer would refuse it the same way.
    assert not can_fail_over(ApiError(Stage.PROVISION, 400, "disk too small", error_type="insufficient_disk"))


# -------------------------------------------------------------------------- SSH wait


@pytest.mark.parametrize(("template", "image", "wait_min", "server_min"), [
    (None, None, 10, None),  # seed 000's 10 minutes; the server's own check gives up after 8
    ("t1", "nvidia/cuda:12.6.3-runtime-ubuntu22.04", 12, 10),  # a template: the server allows 10
    ("t1", None, 12, 10),  # the image could not be looked up: the template default
    ("t1", "ollama/ollama:latest", 14, 12),
    ("t1", "vllm/vllm-openai:latest", 17, 15),
    ("t1", "ghcr.io/huggingface/text-generation-inference:latest", 14, 12),
])
def test_ssh_wait_is_the_servers_check_plus_margin_never_below_the_seed(template, image, wait_min, server_min):
    wait = ssh_wait_for(template, image)
    assert wait.seconds == wait_min * 60
    assert wait.server_minutes == server_min
    assert ("heavy image" in wait.reason) == (server_min is not None and server_min > 10)


def test_sandbox_template_lookup_gives_the_image_and_a_heavy_wait(sandbox, api):
    template = api.get("/api/v1/templates/9b2f3c0e8d7a4f61b5c2e1d0a3f4b5c6").json()
    assert template["image"] == "ollama/ollama" and template["tag"] == "latest"
    assert api.get("/api/v1/templates/nope").status_code == 404
    settings = resolve({"time_scale": str(TIME_SCALE)}, {}, lambda name: None)

    async def images():
        provider = ShopperProvider(ShopperClient(sandbox.url, token=SANDBOX_TOKEN), settings)
        try:
            return (await provider.template_image("9b2f3c0e8d7a4f61b5c2e1d0a3f4b5c6"),
                    await provider.template_image("nope"))
        finally:
            await provider.client.aclose()

    known, unknown = asyncio.run(images())
    assert known == "ollama/ollama" and unknown is None
    assert ssh_wait_for("9b2f3c0e8d7a4f61b5c2e1d0a3f4b5c6", known).server_minutes == 12


def test_create_sends_the_template_and_its_ssh_timeout_only_when_asked():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(201, json={"session": {"id": "s-1", "status": "provisioning"}, "ssh_private_key": "k"})

    settings = resolve({"time_scale": str(TIME_SCALE)}, {}, lambda name: None)
    provider = ShopperProvider(ShopperClient("http://shopper.test", transport=httpx.MockTransport(handler)), settings)
    chosen = offer("vastai-1", "Spain, ES")
    asyncio.run(provider.create(chosen, "c-a1", 1, template="t1", ssh_timeout_minutes=12))
    asyncio.run(provider.create(chosen, "c-a2", 1))
    assert bodies[0]["template_hash_id"] == "t1" and bodies[0]["ssh_timeout_minutes"] == 12
    assert "template_hash_id" not in bodies[1] and "ssh_timeout_minutes" not in bodies[1]


TEMPLATE = "9b2f3c0e8d7a4f61b5c2e1d0a3f4b5c6"  # the sandbox catalog's Ollama template
TEMPLATE_MATRIX = f"""
workload: {{duration: 2s}}
offer: {{template: {TEMPLATE}}}
matrix:
  - {{gpu: RTX 5070, provider: vastai, model: qwen2:1.5b}}
"""


def test_provisioning_fails_over_with_a_template_and_releases_every_attempt(sandbox, api, tmp_path):
    """In process, on the real sandbox: what gpu_session does, without pytest around it."""
    settings = resolve({"api": sandbox.url, "time_scale": str(TIME_SCALE), "reports": str(tmp_path),
                        "run_id": "inproc"}, {"GPUBENCH_API_TOKEN": SANDBOX_TOKEN}, lambda name: None)
    run = RunContext(settings)
    (cell,) = expand(parse_matrix(TEMPLATE_MATRIX, "gpubench_t.yaml"))
    api.post("/sandbox/faults", json={"fault": "provision_error", "offer_id": "vastai-18430701",
                                      "times": 1}).raise_for_status()
    recorder = CellRecorder.start(run.store, run.run_id, cell, cell.cell_id, settings.progress_dir, "main")
    wanted = Constraints(cell.gpu, cell.provider, cell.vram_gb)
    choice = run_async(run.provider_for(cell.cloud).choose_offer(wanted), 30)
    assert choice.offer.id == "vastai-18430701"
    try:
        first = Provisioning(run, recorder, cell, choice, wanted)
        try:
            ready = first.run_until_ready()
            assert (ready.attempt.number, ready.attempt.offer.id) == (2, "vastai-18430702")
            assert ready.session.status == "running" and ready.attempt.consumer_id.endswith("-a2")
        finally:
            first.release_all()
        # The cell run again in this run (--gpubench-resume) numbers on: consumer ids stay unique.
        again = Provisioning(run, recorder, cell, choice, wanted)
        try:
            assert again.run_until_ready().attempt.number == 3
        finally:
            again.release_all()
        attempts = run.store.attempts(row_id=recorder.row_id)
        assert [(a.attempt, a.status) for a in attempts] == [(1, "failed"), (2, "ready"), (3, "ready")]
        assert all(a.ended_at and a.session_status == "stopped" for a in attempts)
        assert run.store.cell(recorder.row_id).attempts == 1  # this try's count
    finally:
        run.close()
    mine = [s for s in api.get("/sandbox/state").json()["sessions"] if s["consumer_id"].startswith("gpubench-inproc-")]
    assert len(mine) == 3 and {s["status"] for s in mine} == {"stopped"}
    assert {s["template_hash_id"] for s in mine} == {TEMPLATE}
    ready_lines = [line.fields for line in read_progress(recorder.progress.path)
                   if line.label == "ATTEMPT" and line.fields.get("outcome") == "ready"]
    assert ready_lines and "image ollama/ollama (heavy image)" in ready_lines[0]["ssh_wait"]


# ---------------------------------------------------------------------------- budget


def attempt_row(price: float, *, started: float, session_after: float | None = 0.0, ended: float | None = None,
                cost: float | None = None, expected: float = 3600.0) -> AttemptRecord:
    """An attempt, times in seconds before NOW."""
    at = lambda seconds: (NOW - timedelta(seconds=seconds)).isoformat()  # noqa: E731
    return AttemptRecord(row_id="run-1/cell", attempt=1, run_id="run-1", status="provisioning",
                         price_per_hour=price, started_at=at(started), expected_seconds=expected,
                         session_started_at=at(started - session_after) if session_after is not None else None,
                         ended_at=at(ended) if ended is not None else None, cost_usd=cost)


def test_spend_of_ended_running_and_not_yet_created_attempts():
    rows = [
        attempt_row(1.0, started=7200, ended=3600, cost=0.9),  # ended: its recorded cost
        attempt_row(2.0, started=5400, ended=1800),  # ended without a cost: price x lifetime (1 h)
        attempt_row(3.6, started=1800, expected=3600),  # running 30 min of an expected hour
        attempt_row(3.6, started=7200, expected=3600),  # running past its expected hour: commits nothing more
        attempt_row(1.2, started=60, session_after=None, expected=3660),  # create not answered yet
    ]
    spend = spend_of(rows, NOW)
    assert spend.spent == pytest.approx(0.9 + 2.0 + 1.8 + 7.2)
    assert spend.committed == pytest.approx(1.8 + 0 + 1.2)
    assert spend.total == pytest.approx(spend.spent + spend.committed)
    assert spend_of([], NOW) == Spend(0.0, 0.0)


def test_refusal_and_exhaustion_name_the_figures():
    spend = Spend(spent=3.0, committed=1.5)
    assert refusal(5.0, spend, price_per_hour=0.5, expected_seconds=3600) is None  # 4.5 + 0.5 = 5.0 fits
    reason = refusal(5.0, spend, price_per_hour=0.6, expected_seconds=3600)
    assert reason == ("budget $5.00: spent $3.00 + committed $1.50 + this cell's expected $0.6000 "
                      "($0.600/h x 60.0 min) would pass it")
    assert exhausted(5.0, spend) is None
    assert exhausted(4.5, spend) == "budget $4.50 used up: spent $3.00 + committed $1.50 by running cells"
    assert admission(None, 1.0, 60, lambda: NOW) is None  # no budget, nothing to check
    admit = admission(5.0, 0.6, 3600, lambda: NOW)
    assert admit([attempt_row(4.5, started=0, expected=3600)]) is not None
    assert admit([]) is None
    assert skipped_by_budget(f"[provision] {reason}") and skipped_by_budget("[inventory] budget $4.50 used up: ...")
    assert not skipped_by_budget("[inventory] no offers found for H100 on vastai") and not skipped_by_budget(None)
    assert summary_line(5.0, 2.5, 2) == "budget $5.00: spent $2.50 (50 %); 2 cell(s) skipped by the budget"


def test_expected_session_seconds_scales_setup_but_not_the_benchmark():
    assert expected_session_seconds(300, 1, 1.0) == 600 + 60 + 300
    assert expected_session_seconds(300, 3, 0.02) == pytest.approx(660 * 0.02 + 900)


def test_attempts_are_recorded_and_priced(tmp_path):
    with Manifest(tmp_path / "m.db") as manifest:
        row = manifest.add_cell("run-1", "cell", gpu_type="RTX 3090", provider="vastai", model="qwen2:7b",
                                matrix_file="m.yaml")
        assert manifest.start_attempt(row, 1, offer_id="vastai-1", price_per_hour=3600.0, location="Spain, ES",
                                      machine_id=23011, consumer_id="c-a1", expected_seconds=60) is None
        manifest.end_attempt(row, 1, session_status=None)  # the create failed: no session, no cost
        manifest.update_attempt(row, 1, status="failed", stage=Stage.PROVISION, error="API answered 503")
        manifest.start_attempt(row, 2, offer_id="vastai-2", price_per_hour=3600.0, consumer_id="c-a2")
        manifest.update_attempt(row, 2, session_id="s-2")
        manifest.end_attempt(row, 2, session_status="stopped")
        manifest.end_attempt(row, 2, session_status="ignored")  # a second end changes nothing
        first, second = manifest.attempts(row_id=row)
        assert (first["attempt"], first["status"], first["stage"], first["cost_usd"]) == (1, "failed", "provision", 0)
        assert first["machine_id"] == "23011" and first["run_id"] == "run-1"
        assert second["session_started_at"] and second["ended_at"] and second["session_status"] == "stopped"
        assert 0 < second["cost_usd"] < 60  # $1/s for the moment the session lived
        assert manifest.cell(row)["attempts"] == 2
        with pytest.raises(ValueError, match="not updatable"):
            manifest.update_attempt(row, 2, ended_at="now")
        with pytest.raises(ValueError, match="status"):
            manifest.update_attempt(row, 2, status="running")


RACERS = 6
ADMITTED = 2
PRICE = 1.0


def _reserve(path: str, worker: int, start, outcomes) -> None:
    """One xdist-like worker: try to reserve a one-hour session against a shared budget."""
    try:
        manifest = Manifest(path)
        row = manifest.add_cell("run-b", f"cell-{worker}", gpu_type="RTX 4090", provider="vastai",
                                model="qwen2:7b", matrix_file="m.yaml")
        budget = ADMITTED * PRICE + PRICE / 2  # room for two sessions and half of a third
        check = admission(budget, PRICE, 3600, lambda: datetime.now(timezone.utc))

        def admit(rows):
            # A slow check: every racer would read the same rows if the read were not
            # inside the write transaction (checked: all six are admitted then).
            time.sleep(0.3)
            return check(rows)

        start.wait()
        refused = SqliteStore(manifest).start_attempt(row, 1, admit=admit, price_per_hour=PRICE,
                                                      expected_seconds=3600)
        manifest.close()
        outcomes.put((worker, refused or "admitted"))
    except BaseException:
        outcomes.put((worker, traceback.format_exc()))


def test_concurrent_workers_cannot_both_take_the_last_dollar(tmp_path):
    path = str(tmp_path / "manifest.db")
    Manifest(path).close()  # the schema exists before the race
    ctx = multiprocessing.get_context("spawn")
    start, outcomes = ctx.Barrier(RACERS), ctx.Queue()
    processes = [ctx.Process(target=_reserve, args=(path, n, start, outcomes)) for n in range(RACERS)]
    for process in processes:
        process.start()
    results = dict(outcomes.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    admitted = [w for w, outcome in results.items() if outcome == "admitted"]
    refused = [outcome for outcome in results.values() if outcome != "admitted"]
    assert len(admitted) == ADMITTED, results
    assert all(reason.startswith("budget $2.50: spent $0.0000 + committed $2.00") for reason in refused), refused
    with Manifest(path) as manifest:
        assert len(manifest.attempts("run-b")) == ADMITTED  # a refused attempt writes nothing


# ------------------------------------------------------------------ end to end: faults

#: 1 s benchmarks without a warmup: these tests check which offers are tried and why, not the figures.
FAILOVER_MATRIX = """
workload: {duration: 1s, max_tokens: 16, warmup_requests: 0, progress_interval: 1s}
matrix:
  - {gpu: RTX 3090, provider: vastai, model: qwen2:1.5b}
  - {gpu: RTX 5060 Ti, provider: vastai, model: qwen2:1.5b}
  - {gpu: RTX 4090, provider: vastai, model: qwen2:1.5b}
"""
# The sandbox catalog's offers in select_offer's order (cheapest first).
RTX_3090 = ["vastai-18430101", "vastai-18430102", "vastai-18430103"]
RTX_5060_TI = ["vastai-18430601", "vastai-18430602", "vastai-18430603"]
RTX_4090 = ["vastai-18430205", "vastai-18430202", "vastai-18430201"]


def run_cells(tmp_path, url: str, keyword: str, *extra: str):
    matrix = tmp_path / "gpubench_failover.yaml"
    matrix.write_text(FAILOVER_MATRIX)
    return run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-k", keyword, "-rs", *extra)


def arm(url: str, fault: str, offer_id: str, **extra) -> None:
    httpx.post(f"{url}/sandbox/faults", headers=SANDBOX_AUTH,
               json={"fault": fault, "offer_id": offer_id, **extra}).raise_for_status()


def cell_and_attempts(tmp_path) -> tuple[dict, list[dict]]:
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    (cell,) = list(db["benchmark_manifest"].rows)
    attempts = sorted(db["attempts"].rows_where("manifest_id = ?", [cell["id"]]), key=lambda a: a["attempt"])
    return cell, attempts


def progress_attempts(cell: dict) -> list[dict]:
    return [line.fields for line in read_progress(cell["progress_file"]) if line.label == "ATTEMPT"]


@pytest.mark.slow
def test_provision_error_at_boot_fails_over_to_another_location(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    arm(url, "provision_error", RTX_3090[0], message="No available public IPs", when="boot")
    done = run_cells(tmp_path, url, "3090")
    assert done.returncode == 0, done.stdout[-3000:]
    cell, attempts = cell_and_attempts(tmp_path)
    assert cell["status"] == "success" and cell["attempts"] == 2
    assert cell["offer_id"] == RTX_3090[1] and cell["session_status"] == "stopped"
    first, second = attempts
    assert (first["offer_id"], first["status"], first["stage"]) == (RTX_3090[0], "failed", "provision")
    assert "No available public IPs" in first["error"] and first["location"] == "Spain, ES"
    assert first["session_status"] == "stopped" and first["ended_at"] and first["cost_usd"] > 0
    assert (second["offer_id"], second["status"], second["location"]) == (RTX_3090[1], "ready", "Quebec, CA")
    assert first["consumer_id"].endswith("-a1") and second["consumer_id"].endswith("-a2")
    assert cell["cost_usd"] > second["cost_usd"]  # the cell paid for both sessions
    assert [(a["attempt"], a["outcome"]) for a in progress_attempts(cell)] == [("1", "failed"), ("2", "ready")]
    assert_every_session_released(url)
    assert {s["offer_id"] for s in sandbox_sessions(url)} == set(RTX_3090[:2])


@pytest.mark.slow
def test_provision_error_at_create_on_every_offer_fails_the_cell_listing_the_attempts(
        tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    for offer_id in RTX_3090:
        arm(url, "provision_error", offer_id, message="No available public IPs", when="create")
    done = run_cells(tmp_path, url, "3090")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "[provision] 3 offer(s) tried, none came up (max attempts (3) reached)" in done.stdout
    assert "rerun the cell" in done.stdout  # the last error's hint survives the attempts list
    assert "Traceback" not in done.stdout
    cell, attempts = cell_and_attempts(tmp_path)
    assert cell["status"] == "failed" and cell["failure_stage"] == "provision" and cell["attempts"] == 3
    for offer_id in RTX_3090:
        assert f"{offer_id} (" in cell["error_message"]
    assert [a["offer_id"] for a in attempts] == RTX_3090
    for attempt in attempts:
        assert attempt["status"] == "failed" and attempt["stage"] == "provision"
        assert "API answered 500" in attempt["error"] and "No available public IPs" in attempt["error"]
        assert attempt["session_id"] is None and attempt["cost_usd"] == 0 and attempt["ended_at"]
    assert_every_session_released(url, create_refused=3)


@pytest.mark.slow
def test_stale_inventory_fails_over_to_a_fresh_offer(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    arm(url, "stale_inventory", RTX_5060_TI[0])
    done = run_cells(tmp_path, url, "5060")
    assert done.returncode == 0, done.stdout[-3000:]
    cell, attempts = cell_and_attempts(tmp_path)
    assert cell["status"] == "success" and cell["attempts"] == 2 and cell["offer_id"] == RTX_5060_TI[1]
    assert attempts[0]["stage"] == "provision" and "503 stale_inventory" in attempts[0]["error"]
    assert attempts[1]["status"] == "ready" and attempts[1]["session_status"] == "stopped"
    assert_every_session_released(url, create_refused=1)


@pytest.mark.slow
def test_ssh_that_never_comes_up_fails_at_ssh_wait_after_max_attempts(tmp_path, standalone_sandbox):  # noqa: F811
    url = standalone_sandbox
    for offer_id in RTX_4090[:2]:
        arm(url, "no_ssh", offer_id)
    done = run_cells(tmp_path, url, "4090", "--gpubench-max-attempts", "2")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "[ssh_wait] 2 offer(s) tried, none came up (max attempts (2) reached)" in done.stdout
    cell, attempts = cell_and_attempts(tmp_path)
    assert cell["status"] == "failed" and cell["failure_stage"] == "ssh_wait" and cell["attempts"] == 2
    assert [a["offer_id"] for a in attempts] == RTX_4090[:2]
    for attempt in attempts:
        assert attempt["stage"] == "ssh_wait" and "SSH verification timeout" in attempt["error"]
        assert attempt["session_status"] == "stopped"
    assert_every_session_released(url)
    assert len(sandbox_sessions(url)) == 2  # the third offer was never rented


# -------------------------------------------------------------------- end to end: budget

BUDGET_MATRIX = """
workload: {duration: 2s, max_tokens: 32, warmup_requests: 1, progress_interval: 1s}
matrix:
  - {gpu: RTX 5060 Ti, provider: vastai, model: qwen2:1.5b}
  - {gpu: H200 NVL, provider: vastai, model: qwen2:1.5b}
  - {gpu: RTX 3090, provider: vastai, model: qwen2:1.5b}
"""


@pytest.mark.slow
def test_budget_lets_the_cheap_cells_start_and_skips_the_one_it_cannot_afford(tmp_path, standalone_sandbox):  # noqa: F811
    # Expected lifetime at this clock: 660 s x 0.02 + 2 s = 15.2 s, so the cheap cells
    # reserve about $0.0003 each and the $2.00/h H200 about $0.0084: with $0.002 the
    # H200 never fits, whatever the others really cost, and the cheap ones always do.
    url = standalone_sandbox
    matrix = tmp_path / "gpubench_budget.yaml"
    matrix.write_text(BUDGET_MATRIX)
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-n", "2", "-rs", "--gpubench-budget", "0.002")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed, 1 skipped" in done.stdout
    assert "[provision] budget $0.0020: spent $" in done.stdout
    assert "budget $0.0020: spent $0.0" in done.stdout and "1 cell(s) skipped by the budget" in done.stdout
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    cells = {row["cell_id"]: row for row in db["benchmark_manifest"].rows}
    h200 = cells["H200_NVL-vastai-qwen2:1.5b"]
    assert h200["status"] == "skipped" and "this cell's expected $0.0084" in h200["error_message"]
    assert h200["session_id"] is None and not h200["attempts"]
    for cell_id in ("RTX_5060_Ti-vastai-qwen2:1.5b", "RTX_3090-vastai-qwen2:1.5b"):
        assert cells[cell_id]["status"] == "success" and cells[cell_id]["attempts"] == 1
    assert sum(row["cost_usd"] for row in cells.values() if row["cost_usd"]) < 0.002
    assert not any(s["gpu_type"] == "H200 NVL" for s in sandbox_sessions(url))
    assert_every_session_released(url)


@pytest.mark.slow
def test_a_group_whose_offers_went_stale_waits_for_them_instead_of_skipping(tmp_path, standalone_sandbox):  # noqa: F811
    """Every RTX 5060 Ti offer is stale once: the group's first cell fails at provision, and the
    API evicts the offers for the provider's cache TTL. Its next cell, which found offers earlier
    in the run, looks again until they are listed (cloud/offers.py) instead of skipping."""
    url = standalone_sandbox
    for offer_id in RTX_5060_TI:
        arm(url, "stale_inventory", offer_id, times=1)
    matrix = tmp_path / "gpubench_stale_group.yaml"
    matrix.write_text(FAILOVER_MATRIX.replace("model: qwen2:1.5b}", "models: [qwen2:1.5b, qwen2:7b]}"))
    done = run_pytest(tmp_path, str(matrix), "--gpubench-api", url, "--gpubench-time-scale", "0.02",
                      "--rootdir", str(tmp_path), "-k", "5060", "-rs")
    db = sqlite_utils.Database(tmp_path / "reports" / "manifest.db")
    cells = {row["model"]: row for row in db["benchmark_manifest"].rows}
    first, second = cells["qwen2:1.5b"], cells["qwen2:7b"]
    assert (first["status"], first["failure_stage"]) == ("failed", "provision"), done.stdout[-3000:]
    assert second["status"] == "success", (second["status"], second["error_message"], done.stdout[-3000:])
    assert "1 failed, 1 passed" in done.stdout
