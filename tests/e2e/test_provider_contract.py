"""The ``Provider`` contract (cloud/provider.py): every implementation in the registry
passes it against the sandbox, so the next provider gets the suite for free. The checks any
provider passes are the package's own (``run/provider_contract.py``, what a third party runs on
theirs: tests/e2e/test_toy_provider.py); the sandbox's faults add the states only it can make.

Each operation is exercised on the real sandbox API: offers, a cell's choice,
create, wait running, SSH details (a real SSH login), watch, the sessions a run
owns, release in every state a session can be in (running, stopped, unknown,
failed, stopping), cost. The last test shows the two callers of release, a cell's
teardown and cleanup, record the same outcome for the same state.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from polling import wait_for
from e2e_helpers import SANDBOX_TOKEN

from pytest_gpubench.aio import run as run_async
from pytest_gpubench.run.cleanup import Leftover, ReleaseOutcome, record, release
from pytest_gpubench.cloud.provider import Constraints, OfferChoice, Provider, consumer_id
from pytest_gpubench.run.provisioning import Attempt, Provisioning
from pytest_gpubench.run.provider_contract import (ProviderUnderTest, check_offers, check_protocol, check_session,
                                                   check_unknown_session)
from pytest_gpubench.cloud.registry import LEASING_MACHINES, PROVIDERS, RENTING_NOTHING, build_provider, check_clouds
from pytest_gpubench.errors import ApiError, MatrixError, NoEligibleOffer, Stage, StageError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.run.record import CellRecorder
from pytest_gpubench.run.run_context import RunContext
from pytest_gpubench.sandbox.catalog import load_catalog
from pytest_gpubench.settings import Settings, resolve

TIME_SCALE = 0.01
_SHIPPED = load_catalog()
#: A destroy that takes 1 s here (100 s scaled): long enough to meet a session ``stopping``.
SANDBOX_CATALOG = _SHIPPED.model_copy(update={"timings": _SHIPPED.timings.model_copy(update={"destroy_seconds": 100})})
OFFER = "vastai-18430201"  # an RTX 4090 the catalog always has
UNKNOWN = "44444444-4444-4444-8444-444444444444"
CALL = 60.0  # bound on one provider call through the loop bridge


@pytest.fixture(params=sorted(set(PROVIDERS) - RENTING_NOTHING - LEASING_MACHINES))
def provider(request: pytest.FixtureRequest, sandbox) -> Iterator[Provider]:
    """Each registered provider that rents, pointed at this module's sandbox (the ones that rent
    nothing, and those leasing GPUs of machines, have their own parts of the contract at the end)."""
    built = build_provider(request.param, Settings(api=sandbox.url, api_token=SANDBOX_TOKEN, time_scale=TIME_SCALE))
    run_async(built.ready(), CALL)
    yield built
    run_async(built.aclose(), CALL)


def call(coro):
    return run_async(coro, CALL)


def rent(provider: Provider, name: str, offer_id: str = OFFER):
    """A session created through ``provider`` for the sandbox offer ``offer_id``."""
    (offer,) = [o for o in call(provider.offers()) if o.id == offer_id]
    return call(provider.create(offer, consumer_id("contract", name), 1))


def running(provider: Provider, name: str):
    created = rent(provider, name)
    return created, call(provider.wait_running(created.session.id, timeout=30))


def status(api: httpx.Client, session_id: str) -> str:
    return api.get(f"/api/v1/sessions/{session_id}").json()["status"]


def start_deleting(api: httpx.Client, session_id: str) -> threading.Thread:
    """DELETE the session in the background; returns once the API shows it ``stopping``."""
    worker = threading.Thread(target=api.delete, args=(f"/api/v1/sessions/{session_id}",), daemon=True)
    worker.start()
    wait_for(lambda: status(api, session_id) == "stopping", 20, f"session {session_id} to be stopping")
    return worker


def test_every_registered_provider_is_a_provider(provider):
    assert isinstance(provider, Provider)
    assert provider.where


@pytest.mark.parametrize("cloud", sorted(PROVIDERS))
def test_every_providers_methods_take_the_protocols_parameters(cloud):
    """isinstance only checks that the methods exist: a keyword the protocol gained (``create``'s
    ``launch``) and one implementation lacks would fail only when a cell calls it."""
    built = build_provider(cloud, resolve({}, {}, lambda name: None))
    call(check_protocol(ProviderUnderTest(built, Constraints("RTX4090", "vastai", vram_gb=8))))


def subject(provider: Provider) -> ProviderUnderTest:
    """The package's contract checks on ``provider``, asking for the sandbox's RTX 4090 on Vast.ai."""
    return ProviderUnderTest(provider, Constraints("RTX4090", "vastai", vram_gb=8), timeout=CALL)


def test_offers_and_the_choice_for_a_cell(provider):
    call(check_offers(subject(provider)))
    offers = call(provider.offers())
    assert offers and OFFER in {o.id for o in offers}
    choice = call(provider.choose_offer(Constraints("RTX4090", "vastai", vram_gb=8)))
    assert isinstance(choice, OfferChoice)
    assert choice.offer in choice.eligible and choice.offers_found >= len(choice.eligible)
    assert choice.offer.gpu_type == "RTX 4090" and choice.offer.provider == "vastai"
    with pytest.raises(NoEligibleOffer, match="price"):
        call(provider.choose_offer(Constraints("RTX4090", "vastai", vram_gb=8, max_price=0.001)))


def test_a_session_from_create_to_release(provider, api):
    """The package's check (create, wait, an SSH login with the details, watch, owned sessions,
    release twice, cost), and on the sandbox's side the session has stopped."""
    call(check_session(subject(provider)))
    (ended,) = [s for s in api.get("/api/v1/sessions").json()["sessions"]
                if s["consumer_id"] == consumer_id("contract", "session")]
    assert ended["status"] == "stopped"


def test_owned_sessions_leave_foreign_consumers_out(provider, api):
    answer = api.post("/api/v1/sessions", json={"consumer_id": "someone-else", "offer_id": OFFER,
                                                "workload_type": "interactive", "reservation_hours": 1})
    foreign = answer.json()["session"]["id"]
    try:
        assert foreign not in {s.id for s in call(provider.owned_sessions())}
    finally:
        api.delete(f"/api/v1/sessions/{foreign}")


def test_the_watch_sees_an_instance_the_provider_lost(provider, api):
    created, _ = running(provider, "lost")
    session_id = created.session.id
    api.post("/sandbox/faults", json={"fault": "kill_instance", "session_id": session_id}).raise_for_status()
    gone = call(provider.get_session(session_id, Stage.BENCHMARK))
    assert gone.status != "running" and gone.error
    assert call(provider.release(session_id)).final_status == "stopped"


def test_release_of_an_unknown_session_finds_nothing(provider):
    call(check_unknown_session(subject(provider)))
    released = call(provider.release(UNKNOWN))
    assert not released.found and released.final_status == "not_found"
    assert call(provider.session_cost(UNKNOWN)) is None
    with pytest.raises(ApiError) as info:
        call(provider.get_session(UNKNOWN, Stage.CLEANUP))
    assert info.value.status == 404


def test_a_failed_session_fails_the_wait_and_release_ends_its_instance(provider, api):
    api.post("/sandbox/faults", json={"offer_id": OFFER, "fault": "provision_error", "when": "boot",
                                      "message": "No available public IPs", "times": 1}).raise_for_status()
    created = rent(provider, "failed")
    with pytest.raises(StageError) as info:
        call(provider.wait_running(created.session.id, timeout=30))
    assert info.value.stage is Stage.PROVISION and "No available public IPs" in str(info.value)
    released = call(provider.release(created.session.id))
    assert (released.before, released.after) == ("failed", "stopped")  # DELETE ended its instance


def test_ssh_that_never_comes_up_fails_the_wait_at_ssh_wait(provider, api):
    api.post("/sandbox/faults", json={"offer_id": OFFER, "fault": "no_ssh", "times": 1}).raise_for_status()
    created = rent(provider, "no-ssh")
    polls = []
    with pytest.raises(StageError) as info:
        call(provider.wait_running(created.session.id, lambda s, waited: polls.append(s.status), timeout=1))
    assert info.value.stage is Stage.SSH_WAIT and polls and "running" not in polls
    assert not call(provider.release(created.session.id)).still_holding


def test_release_waits_for_a_stopping_session_to_stop(provider, api):
    created, _ = running(provider, "stopping")
    deleting = start_deleting(api, created.session.id)
    released = call(provider.release(created.session.id))
    deleting.join(30)
    assert (released.before, released.after, released.still_holding) == ("stopping", "stopped", False)


# --------------------------------------------------------------- the callers agree


def test_unknown_cloud_names_the_file_the_field_and_the_known_clouds():
    (cell,) = expand(parse_matrix("cloud: moon\nmatrix: [{gpu: RTX 4090, provider: vastai, model: qwen2:7b}]",
                                  "gpubench_m.yaml"))
    with pytest.raises(MatrixError, match=r"^gpubench_m.yaml: cloud: unknown cloud 'moon'; known clouds: shopper"):
        check_clouds([cell])
    check_clouds(expand(parse_matrix("matrix: [{gpu: RTX 4090, provider: vastai, model: qwen2:7b}]", "m.yaml")))


def test_teardown_and_cleanup_release_alike(sandbox, api, tmp_path):
    """One session-release path: for a session in each state, a cell's teardown
    (``Provisioning.release_all``) and ``gpubench cleanup`` (``cleanup.release``)
    record the same status."""
    settings = Settings(api=sandbox.url, api_token=SANDBOX_TOKEN, time_scale=TIME_SCALE, reports=tmp_path,
                        manifest=tmp_path / "m.db", run_id="agree")
    run = RunContext(settings)
    (cell,) = expand(parse_matrix("matrix: [{gpu: RTX 4090, provider: vastai, model: qwen2:7b}]", "gpubench_a.yaml"))
    provider = run.provider_for(cell.cloud)
    offer = next(o for o in call(provider.offers()) if o.id == OFFER)
    recorder = CellRecorder.start(run.store, run.run_id, cell, cell.cell_id, settings.progress_dir, "main")
    teardown = Provisioning(run, recorder, cell, OfferChoice(offer, 1, [offer]), Constraints.for_cell(cell))

    def session_in(state: str, name: str) -> str:
        if state == "unknown":
            return {"teardown": UNKNOWN, "cleanup": UNKNOWN.replace("4", "5")}[name]
        if state == "failed":
            api.post("/sandbox/faults", json={"offer_id": OFFER, "fault": "provision_error", "times": 1,
                                              "message": "No available public IPs"}).raise_for_status()
        created = rent(provider, f"{state}-{name}")
        session_id = created.session.id
        wait_for(lambda: status(api, session_id) in ("running", "failed"), 30, f"session {session_id} to settle")
        if state == "stopped":
            api.post(f"/api/v1/sessions/{session_id}/done").raise_for_status()
        return session_id

    recorded = {}
    try:
        for number, state in enumerate(("running", "stopped", "unknown", "failed", "stopping"), start=1):
            ids = {name: session_in(state, name) for name in ("teardown", "cleanup")}
            deleting = [start_deleting(api, s) for s in ids.values()] if state == "stopping" else []
            for attempt, name in ((2 * number - 1, "teardown"), (2 * number, "cleanup")):
                run.store.start_attempt(recorder.row_id, attempt, offer_id=OFFER, consumer_id=f"c{attempt}")
                run.store.update_attempt(recorder.row_id, attempt, session_id=ids[name])
            teardown.attempts = [Attempt(2 * number - 1, offer, f"c{2 * number - 1}", session_id=ids["teardown"])]
            teardown.release_all()
            action = call(release(provider, Leftover(session_id=ids["cleanup"], run_id=run.run_id,
                                                     row_id=recorder.row_id, attempt=2 * number)))
            assert action.outcome is not ReleaseOutcome.FAILED, action
            record(run.store, action, "gpubench cleanup")
            for worker in deleting:
                worker.join(30)
            rows = {row.attempt: row for row in run.store.attempts(row_id=recorder.row_id)}
            recorded[state] = (rows[2 * number - 1].session_status, rows[2 * number].session_status)
        assert recorder.cleanup_error is None
    finally:
        run.close()
    assert recorded == {"running": ("stopped", "stopped"), "stopped": ("stopped", "stopped"),
                        "unknown": ("not_found", "not_found"), "failed": ("stopped", "stopped"),
                        "stopping": ("stopped", "stopped")}


def test_the_registry_is_the_only_place_a_provider_is_built():
    """No module but ``cloud/registry.py`` constructs an implementation (``ShopperProvider(...)``,
    ``ShopperProvider.from_settings``): commands and fixtures ask the registry by ``cloud:`` name."""
    import ast
    from pathlib import Path

    import pytest_gpubench

    package = Path(pytest_gpubench.__file__).parent
    implementations = {"ShopperProvider"}
    builders = []
    for module in package.rglob("*.py"):
        if module.relative_to(package).as_posix() == "cloud/registry.py":
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            target = func.value if isinstance(func, ast.Attribute) and func.attr == "from_settings" else func
            if isinstance(target, ast.Name) and target.id in implementations:
                builders.append(f"{module.relative_to(package)}:{node.lineno}")
    assert builders == [], f"build providers through cloud/registry.py, not at {builders}"


def test_the_plugin_reaches_a_session_by_the_providers_ssh_details(provider, tmp_path):
    """``gpu_ssh`` and a benchmark's reconnect log in with ``Provider.ssh_details``, not with
    what one provider's ``Session`` happens to carry: here its host is one nothing answers on."""
    from pytest_gpubench.run.cell_benchmark import GpuSession, connect
    from pytest_gpubench.remote.ssh import KeyFile

    created, session = running(provider, "details")
    ssh = provider.ssh_details(created, session)
    elsewhere = session.model_copy(update={"ssh_host": "192.0.2.1", "ssh_port": 9})  # TEST-NET-1: unreachable
    run = RunContext(Settings(api=provider.where, api_token=SANDBOX_TOKEN, manifest=tmp_path / "m.db",
                              reports=tmp_path))
    key_file = KeyFile(ssh.private_key, name=session.id)
    offer = call(provider.offers())[0]
    try:
        gpu_session = GpuSession(elsewhere, ssh, key_file, OfferChoice(offer, 1, [offer]))

        async def login() -> str:
            conn = await connect(run, gpu_session, 20)
            try:
                return (await conn.run("echo via-details", stage=Stage.SSH_CONNECT, what="a login", timeout=20)).stdout
            finally:
                await conn.close()

        assert "via-details" in call(login())
    finally:
        key_file.remove()
        run.close()
        call(provider.release(session.id))


# ------------------------------------------------- providers that rent nothing (a running endpoint)


@pytest.fixture(params=sorted(RENTING_NOTHING))
def rentless(request: pytest.FixtureRequest) -> Iterator[Provider]:
    built = build_provider(request.param, Settings(api="http://127.0.0.1:9", time_scale=TIME_SCALE))
    call(built.ready())  # asks nothing of any API
    yield built
    call(built.aclose())


def test_a_provider_that_rents_nothing_offers_the_declared_endpoint_and_lets_go(rentless):
    from pytest_gpubench.matrix.fields import EndpointSpec

    assert isinstance(rentless, Provider) and rentless.where
    spec = EndpointSpec(url="https://llm.example.com:8443/v1", price_per_hour=1.25)
    choice = call(rentless.choose_offer(Constraints("RTX 4090", "endpoint", vram_gb=0, endpoint=spec)))
    assert (choice.offer.gpu_type, choice.offer.price_per_hour, choice.offer.provider) == ("RTX 4090", 1.25, "endpoint")
    assert choice.eligible == [choice.offer] and choice.offers_found == 1
    with pytest.raises(NoEligibleOffer, match="runtime: openai"):
        call(rentless.choose_offer(Constraints("RTX 4090", "vastai", vram_gb=8)))
    consumer = consumer_id("contract", "endpoint")
    created = call(rentless.create(choice.offer, consumer, 1))
    running = call(rentless.wait_running(created.session.id, timeout=1))
    assert running.status == "running" and running.price_per_hour == 1.25
    ssh = rentless.ssh_details(created, running)
    assert ssh.local and ssh.private_key == ""  # no SSH: commands run on this machine
    assert [s.id for s in call(rentless.owned_sessions(consumer))] == [created.session.id]
    assert call(rentless.owned_sessions(consumer_id("contract", "other"))) == []
    released = call(rentless.release(created.session.id))
    assert (released.before, released.final_status, released.still_holding) == ("running", "stopped", False)
    assert call(rentless.release(created.session.id)).already_ended
    assert call(rentless.owned_sessions(consumer)) == []
    assert call(rentless.session_cost(created.session.id)) is None
    call(check_unknown_session(ProviderUnderTest(rentless, Constraints("RTX 4090", "endpoint", vram_gb=0))))


# ------------------------------------- providers leasing GPUs of machines the run does not own


@pytest.fixture(params=sorted(LEASING_MACHINES))
def machines(request: pytest.FixtureRequest, tmp_path, monkeypatch) -> Iterator[tuple[Provider, object]]:
    """Each provider of machines, on a sandbox machine with two RTX 4090s (``hosts``: one over SSH;
    ``local``: this machine, given the stand-in nvidia-smi), leasing through a fresh store."""
    from pytest_gpubench.sandbox.server import HostPlan, SandboxHostsThread, local_machine
    from pytest_gpubench.store.sqlite_store import SqliteStore

    store = SqliteStore.open(tmp_path / "manifest.db")
    machines_thread = None
    if request.param == "hosts":
        machines_thread = SandboxHostsThread(tmp_path / "hosts", [HostPlan("lab1", "RTX 4090", 2)])
        inventory = str(machines_thread.start())
    else:
        machine = local_machine(tmp_path, "RTX 4090", 2)
        for name in ("PATH", "OLLAMA_HOST", "GPUBENCH_SANDBOX_INSTANCE"):
            monkeypatch.setenv(name, machine.environment()[name])
        inventory = None
    settings = Settings(hosts=inventory, known_hosts=str(tmp_path / "known_hosts"), gpu_lease_ttl=6,
                        run_id="contract")
    built = build_provider(request.param, settings, store=lambda: store)
    call(built.ready())
    try:
        yield built, store
    finally:
        call(built.aclose())
        store.close()
        if machines_thread is not None:
            machines_thread.stop()


def test_a_machine_provider_offers_its_machines_and_leases_their_gpus(machines, tmp_path):
    provider, store = machines
    (offer,) = call(provider.offers())
    assert (offer.gpu_type, offer.gpu_count, offer.price_per_hour) == ("RTX 4090", 2, 0.0)
    row = "hosts" if provider.where == "hosts" else "local"
    choice = call(provider.choose_offer(Constraints("RTX4090", row, vram_gb=8, gpu_count=1, runtime="vllm")))
    assert choice.offer.gpu_count == 1 and choice.eligible == [choice.offer]
    # A runtime without a server per cell (Ollama's one per machine) is offered the whole machine.
    assert call(provider.choose_offer(Constraints("RTX4090", row, vram_gb=8, runtime="ollama"))).offer.gpu_count == 2
    with pytest.raises(NoEligibleOffer, match="fewer than 4 GPUs"):
        call(provider.choose_offer(Constraints("RTX4090", row, vram_gb=8, gpu_count=4)))
    with pytest.raises(NoEligibleOffer):
        call(provider.choose_offer(Constraints("A100 80GB", row, vram_gb=8)))

    consumer = consumer_id("contract", "machine")
    first = call(provider.create(choice.offer, consumer, 1, runtime="vllm"))
    running = call(provider.wait_running(first.session.id, timeout=10))
    ssh = provider.ssh_details(first, running)
    assert running.status == "running" and ssh.gpu_indices == (0,) and not ssh.declared_hardware
    assert ssh.local == (provider.where == "local")
    second = call(provider.create(choice.offer, consumer_id("contract", "other"), 1, runtime="vllm"))
    assert provider.ssh_details(second, call(provider.wait_running(second.session.id, timeout=10))).gpu_indices == (1,)
    # Ollama serves one server per machine: its cell waits for every GPU, shown while it waits.
    third = call(provider.create(choice.offer, consumer_id("contract", "ollama"), 1, runtime="ollama"))
    assert third.session.status == "pending"
    polls: list[str] = []
    with pytest.raises(StageError, match="stayed busy") as waited:
        call(provider.wait_running(third.session.id, lambda s, _: polls.append(s.status), timeout=1))
    assert waited.value.stage == Stage.PROVISION and "contract/gpubench-contract-machine" in str(waited.value)
    assert polls and set(polls) == {"waiting_for_gpu"}
    call(provider.release(first.session.id))
    call(provider.release(second.session.id))
    running = call(provider.wait_running(third.session.id, timeout=10))
    assert provider.ssh_details(third, running).gpu_indices == (0, 1)

    assert [s.id for s in call(provider.owned_sessions(consumer_id("contract", "ollama")))] == [third.session.id]
    released = call(provider.release(third.session.id))
    assert (released.before, released.final_status, released.still_holding) == ("running", "stopped", False)
    assert call(provider.owned_sessions()) == []
    assert call(provider.session_cost(third.session.id)) is None
    call(check_unknown_session(ProviderUnderTest(provider, Constraints("RTX4090", row, vram_gb=8))))
    leases = store.gpu_leases()
    assert len(leases) == 3 and all(lease.released_at is not None for lease in leases)


def test_a_machine_session_whose_lease_was_lost_is_gone(machines):
    """A lease that could not be renewed (expired, or ended by someone else) may be another's now:
    the session reads ``failed`` with the reason, which the cell's watch turns into InstanceLost."""
    provider, store = machines
    row = "hosts" if provider.where == "hosts" else "local"
    choice = call(provider.choose_offer(Constraints("RTX4090", row, vram_gb=8)))
    created = call(provider.create(choice.offer, consumer_id("contract", "lost"), 1, runtime="vllm"))
    call(provider.wait_running(created.session.id, timeout=10))
    (lease,) = store.gpu_leases(active_at=__import__("time").time())
    store.release_gpu_lease(lease.lease_id)
    wait_for(lambda: call(provider.get_session(created.session.id)).status == "failed", 20,
             "the heartbeat to find its lease gone")
    assert "expired before it could be renewed" in call(provider.get_session(created.session.id)).error


def test_a_dead_runs_lease_runs_out_and_a_waiting_cell_gets_its_gpus(machines):
    """A run that died stops renewing: its lease expires and the cell waiting for the GPUs takes them."""
    provider, store = machines
    row = "hosts" if provider.where == "hosts" else "local"
    choice = call(provider.choose_offer(Constraints("RTX4090", row, vram_gb=8)))
    created = call(provider.create(choice.offer, consumer_id("contract", "first"), 1, runtime="ollama"))
    machine = store.gpu_leases(active_at=__import__("time").time())[0].machine
    call(provider.release(created.session.id))
    dead = store.claim_gpus(machine, [0, 1], 2, holder="dead-run/cell", ttl=2.0)  # never renewed
    assert dead is not None
    waiting = call(provider.create(choice.offer, consumer_id("contract", "waiting"), 1, runtime="ollama"))
    assert waiting.session.status == "pending"
    polls: list[float] = []
    running = call(provider.wait_running(waiting.session.id, lambda _, waited: polls.append(waited), timeout=30))
    ssh = provider.ssh_details(waiting, running)
    assert running.status == "running" and ssh.gpu_indices == (0, 1) and polls
    assert not store.renew_gpu_lease(dead.lease_id, 60)  # the dead run's lease is over


def test_the_plugin_reaches_a_machine_by_the_providers_ssh_details(machines, tmp_path, monkeypatch):
    """``gpu_ssh`` logs in with ``ssh_details`` alone: a host over SSH, its key checked or pinned
    (here pinned: no known_hosts knows it), this machine through a local shell; the GPU is probed."""
    from pytest_gpubench.run.cell_benchmark import GpuSession, connect
    from pytest_gpubench.remote.ssh import KeyFile

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # this machine's persistent home goes there, not in ~

    provider, _ = machines
    row = "hosts" if provider.where == "hosts" else "local"
    choice = call(provider.choose_offer(Constraints("RTX4090", row, vram_gb=8)))
    created = call(provider.create(choice.offer, consumer_id("contract", "login"), 1, runtime="vllm"))
    session = call(provider.wait_running(created.session.id, timeout=10))
    ssh = provider.ssh_details(created, session)
    run = RunContext(Settings(manifest=tmp_path / "m.db", reports=tmp_path))
    key_file = KeyFile(ssh.private_key, name=session.id) if ssh.private_key else None
    pinned: list[str] = []
    try:
        gpu_session = GpuSession(session, ssh, key_file, choice, cloud=row)

        async def gpus() -> str:
            conn = await connect(run, gpu_session, 20, on_pinned=lambda fingerprint, _: pinned.append(fingerprint))
            try:
                return (await conn.run("nvidia-smi --query-gpu=index --format=csv,noheader",
                                       stage=Stage.SSH_CONNECT, what="nvidia-smi", timeout=20)).stdout
            finally:
                await conn.close()

        assert call(gpus()).split() == ["0", "1"]
        assert len(pinned) == (1 if row == "hosts" else 0)
        assert call(gpus()) and len(pinned) == (1 if row == "hosts" else 0)  # known now: checked, not pinned again
    finally:
        if key_file is not None:
            key_file.remove()
        run.close()
        call(provider.release(created.session.id))
