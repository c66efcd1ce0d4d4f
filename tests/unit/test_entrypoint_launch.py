"""Entrypoint mode, without a server: the matrix's ``runtime.launch``, the create body per mode,
the session's API fields, the heavy-image budgets, and a runtime adopting the image's server."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from pytest_gpubench.cloud.shopper_client import ShopperClient

from pytest_gpubench.cloud.provider import Offer
from pytest_gpubench.cloud.shopper_provider import ShopperProvider
from pytest_gpubench.cloud.ssh_wait import entrypoint_wait, heavy_stage_seconds, stage_timeout
from pytest_gpubench.errors import MatrixError, Stage, StageError
from pytest_gpubench.matrix.cells import expand, parse_matrix
from pytest_gpubench.matrix.cells import apply_overrides
from pytest_gpubench.runtimes.openai_server import adopt_image_server
from pytest_gpubench.runtimes.ollama import OllamaRuntime
from pytest_gpubench.runtimes.vllm import VllmRuntime
from pytest_gpubench.settings import resolve

SETTINGS = resolve({"time_scale": "0.01"}, {}, lambda name: None)
ROW = "matrix:\n  - {gpu: RTX 4090, provider: vastai, models: ['qwen2:7b', 'llama3:8b']}\n"
OFFER = Offer(id="vastai-1", provider="vastai", gpu_type="RTX 4090", price_per_hour=0.3)
KEY = "-----BEGIN " "RSA PRIVATE KEY-----x"


def cells(runtime: str, extra: str = "", row: str = ROW):
    return expand(parse_matrix(f"runtime: {runtime}\n{extra}{row}", "gpubench_x.yaml"))


def create_body(runtime: str) -> dict:
    """The JSON the shopper provider posts for the first cell of ``runtime:``."""
    cell, seen = cells(runtime)[0], {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        return httpx.Response(201, json={"session": {"id": "s-1", "status": "provisioning"}, "ssh_private_key": KEY})

    provider = ShopperProvider(ShopperClient("http://shopper.test", transport=httpx.MockTransport(handler)), SETTINGS)
    asyncio.run(provider.create(OFFER, "gpubench-c", 1, launch=cell.launch, runtime=cell.runtime, model=cell.model))
    return seen


def test_an_entrypoint_launch_fills_the_servers_defaults_and_gives_each_cell_its_own_session():
    first, second = cells("{name: vllm, launch: {mode: entrypoint}}")
    assert first.launch is not None and first.launch.image == "vllm/vllm-openai:latest"
    assert first.launch.api_port == 8000
    # The image serves one model, started with the session: no reuse group.
    assert first.reuse == second.reuse == "cell" and first.session_group is None


def test_reuse_group_on_the_command_line_leaves_entrypoint_cells_alone():
    settings = resolve({"reuse": "group"}, {}, lambda name: None)
    (entry,) = cells("{name: vllm, launch: {mode: entrypoint}}", extra="reuse: cell\n",
                     row="matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n")
    (plain,) = cells("vllm", extra="reuse: cell\n", row="matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n")
    assert (apply_overrides(entry, settings).reuse, apply_overrides(plain, settings).reuse) == ("cell", "group")


def test_a_row_sets_the_launch_over_the_files_runtime():
    row = ("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b',\n"
           "     runtime: {launch: {mode: entrypoint, image: 'ghcr.io/acme/vllm:1.2@sha256:" + "a" * 64 + "',"
           " api_port: 9000, exposed_ports: [9000, 22]}}}\n")
    (cell,) = cells("vllm", row=row)
    assert (cell.launch.image.startswith("ghcr.io/acme/vllm:1.2@sha256:"), cell.launch.api_port) == (True, 9000)
    assert (cell.runtime, cell.reuse) == ("vllm", "cell")


@pytest.mark.parametrize(("runtime", "extra", "message"), [
    ("{name: ollama, launch: {mode: entrypoint}}", "",
     "runtime.launch: `mode: entrypoint` needs a runtime GPU Shopper starts from an image (vllm, tgi); "
     "runtime 'ollama' is started by the plugin over SSH"),
    ("{name: vllm, launch: {mode: entrypoint}}", "offer: {template: abc123}\n",
     "`mode: entrypoint` cannot be combined with `offer.template`"),
    ("{name: vllm, launch: {mode: entrypoint, image: 'vllm; rm -rf /'}}", "",
     "runtime.launch.image: must be a plain Docker image reference"),
    ("{name: vllm, launch: {mode: entrypoint, image: 'VLLM/Upper'}}", "", "must be a plain Docker image reference"),
    ("{name: vllm, launch: {mode: entrypoint, api_port: 0}}", "", "runtime.launch.api_port: must be a port from 1"),
    ("{name: vllm, launch: {mode: entrypoint, api_port: 65536}}", "", "must be a port from 1 to 65535"),
    ("{name: vllm, launch: {mode: entrypoint, exposed_ports: [8000, 8000]}}", "", "lists a port twice"),
    ("{name: vllm, launch: {mode: entrypoint, exposed_ports: [8000, 'x']}}", "", "every port must be a port"),
    ("{name: vllm, launch: {mode: ssh, api_port: 8000}}", "", "api_port applies only with `mode: entrypoint`"),
    ("{name: vllm, launch: {mode: ssh, image: 'vllm/vllm-openai:v0.10.1'}}", "",
     "image applies only with `mode: entrypoint`"),
    ("{name: vllm, launch: {mode: docker}}", "", "runtime.launch.mode: must be 'ssh' or 'entrypoint'"),
    ("{name: vllm, launch: {mode: entrypoint, model_id: x}}", "",
     "allowed keys: mode, image, api_port, exposed_ports"),
    ("{name: vllm, port: 8000, launch: {mode: entrypoint}}", "",
     "runtime.port cannot be combined with runtime.launch mode entrypoint"),
])
def test_a_launch_that_cannot_work_stops_collection_with_a_clear_error(runtime, extra, message):
    with pytest.raises(MatrixError) as info:
        cells(runtime, extra)
    assert message in str(info.value)


def test_the_create_body_of_each_mode():
    plain = create_body("vllm")
    assert plain == {"consumer_id": "gpubench-c", "offer_id": "vastai-1", "workload_type": "interactive",
                     "reservation_hours": 1, "idle_threshold_minutes": 5}
    assert create_body("{name: vllm, launch: {mode: ssh}}") == plain  # ssh: the server's default
    entry = create_body("{name: vllm, launch: {mode: entrypoint, api_port: 9000, exposed_ports: [22, 9000]}}")
    assert {k: entry[k] for k in ("launch_mode", "workload_type", "docker_image", "model_id", "exposed_ports")} == {
        "launch_mode": "entrypoint", "workload_type": "llm_vllm", "docker_image": "vllm/vllm-openai:latest",
        "model_id": "qwen2:7b", "exposed_ports": [9000, 22]}  # the API port first: the server's api_port
    assert create_body("{name: vllm, launch: {mode: entrypoint}}")["exposed_ports"] == [8000]


def test_a_session_carries_its_launch_mode_and_api_endpoint():
    answer = {"id": "s-1", "status": "running", "ssh_host": "1.2.3.4", "ssh_port": 40022,
              "launch_mode": "entrypoint", "api_endpoint": "http://1.2.3.4:40800", "api_port": 40800}
    client = ShopperClient("http://shopper.test", transport=httpx.MockTransport(lambda r: httpx.Response(200, json=answer)))
    session = asyncio.run(client.get_session("s-1"))
    assert (session.launch_mode, session.api_endpoint, session.api_port) == (
        "entrypoint", "http://1.2.3.4:40800", 40800)


def test_heavy_images_get_the_tables_minutes_for_provision_ssh_wait_and_install():
    assert heavy_stage_seconds("vllm/vllm-openai:v0.10.1") == {Stage.PROVISION: 900.0, Stage.RUNTIME_SETUP: 900.0}
    assert heavy_stage_seconds("ghcr.io/huggingface/text-generation-inference:3") == {
        Stage.PROVISION: 720.0, Stage.RUNTIME_SETUP: 720.0}
    assert heavy_stage_seconds("nvidia/cuda:12.6.3-runtime-ubuntu22.04") == {}
    # Entrypoint: the server checks /health 10 min for any image; the plugin waits out the longer of that
    # and the table, plus the margin for the server's verdict.
    assert entrypoint_wait("vllm/vllm-openai:x").seconds == 15 * 60 + 120
    assert entrypoint_wait("example/light:1").seconds == 10 * 60 + 120
    assert entrypoint_wait("vllm/vllm-openai:x").server_minutes is None
    # On the run's clock; a light image keeps the seed's budget.
    assert stage_timeout(SETTINGS, Stage.RUNTIME_SETUP, "vllm/vllm-openai:x") == 15.0  # 900 s x 0.01, floor 15
    full = resolve({}, {}, lambda name: None)
    assert stage_timeout(full, Stage.RUNTIME_SETUP, "vllm/vllm-openai:x") == 900.0
    assert stage_timeout(full, Stage.RUNTIME_SETUP, None) == 300.0


def test_a_runtime_adopts_the_images_server_only_in_entrypoint_mode():
    (entry,), (plain,) = (cells("{name: vllm, launch: {mode: entrypoint, api_port: 9000}}",
                                row="matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n"),
                          cells("vllm", row="matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n"))
    runtime = VllmRuntime(conn=None, model=entry.model, started_here=True)  # type: ignore[arg-type]
    assert adopt_image_server(runtime, entry.launch) is True
    assert (runtime.remote_port, runtime.started_here) == (9000, False)
    untouched = VllmRuntime(conn=None, model=plain.model)  # type: ignore[arg-type]
    port = untouched.remote_port
    assert adopt_image_server(untouched, plain.launch) is False and untouched.remote_port == port
    with pytest.raises(Exception, match="cannot use a server its image started"):
        adopt_image_server(OllamaRuntime(conn=None), entry.launch)  # type: ignore[arg-type]


def test_an_image_server_that_does_not_answer_is_never_replaced_by_one_of_the_plugins():
    (entry,) = cells("{name: vllm, launch: {mode: entrypoint, api_port: 9000}}",
                     row="matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n")
    runtime = VllmRuntime(conn=None, model=entry.model)  # type: ignore[arg-type]  # no command may run
    adopt_image_server(runtime, entry.launch)
    with pytest.raises(StageError) as info:
        asyncio.run(runtime._serve(entry.model, 1, 5, Stage.BENCHMARK))
    assert info.value.stage is Stage.BENCHMARK
    assert "the vllm serve the session's image started does not answer /health on port 9000" in str(info.value)


def test_the_plugins_own_wait_names_the_images_server_in_entrypoint_mode():
    answer = {"id": "s-1", "status": "provisioning", "launch_mode": "entrypoint", "api_port": 8000}
    provider = ShopperProvider(ShopperClient("http://shopper.test", transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json=answer))), SETTINGS)
    with pytest.raises(Exception, match="its image's model server never answered /health") as info:
        asyncio.run(provider.wait_running("s-1", timeout=0.05))
    assert str(info.value.stage) == "ssh_wait"


def test_an_entrypoint_cell_is_another_cell_than_the_same_server_started_over_ssh():
    row = ("matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n"
           "  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b', runtime: {launch: {mode: entrypoint}}}\n")
    plain, image = cells("vllm", row=row)
    assert (plain.cell_id, image.cell_id) == ("RTX_4090-vastai-qwen2:7b-runtime_vllm",
                                              "RTX_4090-vastai-qwen2:7b-runtime_vllm-entrypoint")
