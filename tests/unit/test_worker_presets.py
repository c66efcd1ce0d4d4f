"""``runtime: worker``: seed 004's model_presets.yaml checked at collection, the ``docker run`` it makes
quoted, and the worker's events read with a clear error for each way to break them."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest

from pytest_gpubench.errors import MatrixError, Stage, StageError
from pytest_gpubench.matrix.cells import expand, load_matrix
from pytest_gpubench.matrix.worker_presets import load_presets
from pytest_gpubench.remote.loadgen import parse_worker_line, worker_request
from pytest_gpubench.runtimes.worker import WorkerRuntime, check_finished

SHIPPED = Path(__file__).parents[2] / "matrix" / "model_presets.yaml"


def presets_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "model_presets.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def matrix_file(tmp_path: Path, runtime: str, model: str = "llama:7b") -> Path:
    path = tmp_path / "gpubench_workers.yaml"
    path.write_text(f"runtime: {runtime}\nmatrix:\n  - {{gpu: RTX 4090, provider: vastai, model: '{model}'}}\n")
    return path


GOOD = """
models:
  llama:7b:
    inference:
      docker_image: "registry.example.com:5000/team/llama-worker:1.2"
      command: ["python", "/app/worker.py", "--note", "it's here; $(rm -rf /)"]
      env_vars:
        MODEL_NAME: "llama 7b"
        QUOTE: "a \\"b\\" 'c' $HOME `id`"
"""


def test_the_shipped_presets_file_has_the_seeds_shape():
    presets = load_presets(SHIPPED)
    assert presets and all(p.docker_image for p in presets.values())


def test_a_matrix_names_its_presets_file_relative_to_itself_and_each_cell_keeps_it(tmp_path):
    presets_file(tmp_path, GOOD)
    (cell,) = expand(load_matrix(str(matrix_file(tmp_path, "{name: worker, presets: model_presets.yaml}"))))
    assert (cell.runtime, Path(cell.runtime_presets)) == ("worker", tmp_path / "model_presets.yaml")


@pytest.mark.parametrize(("text", "where", "what"), [
    ("models:\n  other:\n    inference: {docker_image: w}\n", "matrix[0].model",
     "'llama:7b' is not in the presets file"),
    ("models:\n  llama:7b:\n    inference: {command: [python]}\n", "models.llama:7b.inference.docker_image",
     "missing: every worker needs a docker_image"),
    ("models:\n  llama:7b:\n    inference: {docker_image: w, command: python /app/worker.py}\n",
     "models.llama:7b.inference.command", "must be a list of words"),
    ("models:\n  llama:7b:\n    inference: {docker_image: w, env_vars: {THREADS: 4}}\n",
     "models.llama:7b.inference.env_vars.THREADS", "must be a string (quote it in YAML)"),
    ("models:\n  llama:7b:\n    inference: {docker_image: w, env_vars: {'BAD NAME': x}}\n",
     "models.llama:7b.inference.env_vars", "'BAD NAME' is not an environment variable name"),
    ("models:\n  llama:7b:\n    inference: {docker_image: w, env_vars: {GPU_DEVICE: '1'}}\n",
     "models.llama:7b.inference.env_vars.GPU_DEVICE", "is set by gpubench for every worker"),
    ("models:\n  llama:7b:\n    inference: {docker_image: 'w; rm -rf /'}\n",
     "models.llama:7b.inference.docker_image", "must be a Docker image reference"),
    ("models:\n  llama:7b:\n    inference: {docker_image: w, entrypoint: x}\n",
     "models.llama:7b.inference.entrypoint", "unknown key; allowed: command, docker_image, env_vars"),
    ("workers: {}\n", "models", "the file needs `models:`"),
])
def test_a_bad_presets_file_stops_collection_naming_the_file_the_key_and_what_is_allowed(tmp_path, text, where,
                                                                                        what):
    presets = presets_file(tmp_path, text)
    with pytest.raises(MatrixError) as info:
        load_matrix(str(matrix_file(tmp_path, "{name: worker, presets: model_presets.yaml}")))
    message = str(info.value)
    assert f"{where}: {what}" in message and str(presets) in message, message
    assert "Traceback" not in message and "\n" not in message


def test_a_worker_row_without_presets_or_with_a_missing_file_is_refused(tmp_path):
    with pytest.raises(MatrixError, match=r"matrix\[0\]\.runtime: runtime worker needs `presets: "):
        load_matrix(str(matrix_file(tmp_path, "worker")))
    with pytest.raises(MatrixError, match="cannot read the presets file: No such file or directory"):
        load_matrix(str(matrix_file(tmp_path, "{name: worker, presets: nowhere.yaml}")))


def test_the_docker_run_command_quotes_every_word_from_the_presets_file(tmp_path):
    presets_file(tmp_path, GOOD)
    (cell,) = expand(load_matrix(str(matrix_file(
        tmp_path, "{name: worker, presets: model_presets.yaml, args: [--shm-size, 2g]}"))))
    runtime = WorkerRuntime.for_cell(None, cell)
    argv = runtime.docker_command()
    assert argv == ["docker", "run", "--rm", "-i", "--gpus", "device=0", "--label", "gpubench-worker",
                    "-e", "MODEL_NAME=llama 7b", "-e", "QUOTE=a \"b\" 'c' $HOME `id`", "-e", "MODEL_PATH=/models",
                    "-e", "GPU_DEVICE=0", "--shm-size", "2g", "registry.example.com:5000/team/llama-worker:1.2",
                    "python", "/app/worker.py", "--note", "it's here; $(rm -rf /)"]
    assert shlex.split(shlex.join(argv)) == argv  # what the warm-up sends through the shell, word for word
    assert runtime.endpoint.worker_command == tuple(argv) and str(runtime.endpoint.api) == "worker"
    with pytest.raises(StageError) as info:
        runtime.docker_command("not-in-presets")
    assert info.value.stage is Stage.MODEL_PULL and "models there: llama:7b" in str(info.value)


def test_a_request_line_is_one_json_object_with_the_prompt_and_its_limits():
    line = worker_request({"model": "m", "extra_body": {"temperature": 0}}, "hi\nthere", 16, ignore_eos=True)
    assert line == b'{"prompt":"hi\\nthere","max_tokens":16,"model":"m","ignore_eos":true,"temperature":0}\n'


@pytest.mark.parametrize(("line", "error"), [
    (b"loading weights...", "not JSON: 'loading weights...'"),
    (b'"text"', "not a JSON object: '\"text\"'"),
    (b'{"delta": "x"}', "no \"event\" name: '{\"delta\": \"x\"}'"),
    (b'{"event": 3}', "no \"event\" name: '{\"event\": 3}'"),
])
def test_a_malformed_event_line_says_what_is_wrong(line, error):
    with pytest.raises(ValueError) as info:
        parse_worker_line(line)
    assert str(info.value) == error
    assert parse_worker_line(b'{"event": "text_delta", "delta": "a"}') == {"event": "text_delta", "delta": "a"}


def test_a_warm_up_that_breaks_says_how_at_model_pull():
    def events(*kinds: dict) -> list:
        return [(float(i), kind) for i, kind in enumerate(kinds)]

    done = events({"event": "connection"}, {"event": "text_delta", "delta": "a"}, {"event": "finish"})
    assert check_finished(done, 0, "") == done
    cases = [
        ([], 125, "no such image", "the worker did not start: it exited with status 125 before its first event; "
                                   "its stderr ends: no such image"),
        (events({"event": "connection"}), 3, "CUDA error", "the worker exited with status 3 before its finish "
                                                           "event; its stderr ends: CUDA error"),
        (events({"event": "finish", "status": "failed", "message": "OOM"}), 0, "",
         "the worker finished with status failed: OOM"),
    ]
    for got, status, stderr, message in cases:
        with pytest.raises(StageError) as info:
            check_finished(got, status, stderr)
        assert info.value.stage is Stage.MODEL_PULL and str(info.value).endswith(message), str(info.value)


@pytest.mark.parametrize(("image", "accepted"), [
    ("Registry.Example.com:5000/team/worker:1.2", True), ("ghcr.io/acme/vllm@sha256:" + "a" * 64, True),
    ("Team/Worker", False), ("w; rm -rf /", False), ("w:" + "x" * 300, False),
])
def test_a_preset_image_and_a_launch_image_are_judged_alike(tmp_path, image, accepted):
    """One image-reference rule (fields.is_image_reference) for workers' presets and entrypoint launches."""
    presets_file(tmp_path, f"models:\n  llama:7b:\n    inference: {{docker_image: '{image}'}}\n")
    launch = tmp_path / "gpubench_launch.yaml"
    launch.write_text(f"runtime: {{name: vllm, launch: {{mode: entrypoint, image: '{image}'}}}}\n"
                      "matrix:\n  - {gpu: RTX 4090, provider: vastai, model: 'qwen2:7b'}\n")
    outcomes = []
    for path in (matrix_file(tmp_path, "{name: worker, presets: model_presets.yaml}"), launch):
        try:
            load_matrix(str(path))
            outcomes.append(True)
        except MatrixError as exc:
            assert "image" in str(exc)
            outcomes.append(False)
    assert outcomes == [accepted, accepted]
