"""hosts.yaml: what the ``hosts`` provider reads, and the errors a bad file gets (file, field, allowed)."""

from __future__ import annotations

import pytest

from pytest_gpubench.cloud.hosts_inventory import load_inventory
from pytest_gpubench.errors import InventoryError


def write(tmp_path, text: str):
    (tmp_path / "id_test").write_text("KEY")
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_an_inventory_reads_with_its_defaults_and_paths_relative_to_it(tmp_path):
    path = write(tmp_path, """
hosts:
  lab1:
    address: 10.0.0.5
    port: 2222
    user: bench
    key_file: id_test
    gpu: RTX 4090
    gpus: 2
    price_per_hour: 0.4
    tags: [lab, ada]
    keep_models: false
    known_hosts: kh
  lab2: {address: lab2.example, agent: true, gpu: A100 80GB}
local: {price_per_hour: 0.1}
""")
    (tmp_path / "kh").write_text("")
    inventory = load_inventory(path)
    lab1, lab2 = inventory.hosts["lab1"], inventory.hosts["lab2"]
    assert (lab1.name, lab1.port, lab1.user, lab1.gpus, lab1.price_per_hour) == ("lab1", 2222, "bench", 2, 0.4)
    assert lab1.key_file == str((tmp_path / "id_test").resolve())
    assert lab1.known_hosts == str((tmp_path / "kh").resolve()) and not lab1.keep_models
    assert (lab2.port, lab2.user, lab2.gpus, lab2.price_per_hour, lab2.keep_models) == (22, "root", 1, 0.0, True)
    assert lab2.agent and lab2.key_file is None
    assert inventory.local.price_per_hour == 0.1
    assert lab1.matches("hosts") and lab1.matches("lab1") and lab1.matches("ADA") and not lab1.matches("lab2")


@pytest.mark.parametrize(("text", "field", "words"), [
    ("hosts: {lab1: {address: a, key_file: id_test, gpu: T4, gpus: 0}}", "hosts.lab1.gpus", "from 1 to 64"),
    ("hosts: {lab1: {address: a, key_file: id_test, gpu: T4, port: 70000}}", "hosts.lab1.port", "from 1 to 65535"),
    ("hosts: {lab1: {address: a, gpu: T4}}", "hosts.lab1", "needs `key_file: PATH`"),
    ("hosts: {lab1: {address: a, key_file: id_test, agent: true, gpu: T4}}", "hosts.lab1", "not both"),
    ("hosts: {lab1: {address: a, key_file: nope, gpu: T4}}", "hosts.lab1.key_file", "no such file"),
    ("hosts: {lab1: {address: a, key_file: id_test, gpu: T4, price_per_hour: -1}}", "hosts.lab1.price_per_hour",
     "from 0 to 1000"),
    ("hosts: {lab1: {address: a, key_file: id_test, gpu: T4, colour: red}}", "hosts.lab1",
     "allowed keys: name, address"),
    ("hosts: {lab1: {key_file: id_test, gpu: T4}}", "hosts.lab1.address", "required key is missing"),
    ("hosts: {lab1: {address: a, key_file: id_test, gpu: T4, tags: [a b]}}", "hosts.lab1.tags", "list of tags"),
    # This machine has no tags (no row could pin it by one): an unknown key, not silently ignored.
    ("local: {tags: [lab]}", "local", "allowed keys: price_per_hour, keep_models"),
    ("local: {price_per_hour: 2000}", "local.price_per_hour", "from 0 to 1000"),
])
def test_a_bad_inventory_names_the_file_the_field_and_what_is_allowed(tmp_path, text, field, words):
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert message.startswith(f"{path.resolve()}: {field}") and words in message, message
    assert "line 1" in message or field == "hosts.lab1.key_file"


def test_a_known_hosts_file_that_is_not_there_is_an_error_naming_the_host_and_field(tmp_path):
    # Issue 21 item 7: it used to be accepted, and the host was then trusted on first use.
    path = write(tmp_path, "hosts: {lab1: {address: a, key_file: id_test, gpu: T4, known_hosts: ./kh}}")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert message.startswith(f"{path.resolve()}: hosts.lab1.known_hosts: no such file"), message
    assert str((tmp_path / "kh").resolve()) in message and "\n" not in message


@pytest.mark.parametrize("make", ["latin-1", "folder"], ids=["not-utf8", "a-folder"])
def test_an_inventory_that_is_not_utf8_text_or_is_a_folder_is_one_line_naming_the_file(tmp_path, make):
    """Issue 21 item 11: the matrix loader's error, not a raw UnicodeDecodeError / IsADirectoryError."""
    from pytest_gpubench.matrix.cells import load_matrix
    from pytest_gpubench.errors import MatrixError

    path = tmp_path / "hosts.yaml"
    if make == "folder":
        path.mkdir()
        words = "cannot read the file: Is a directory"
    else:
        path.write_bytes("hosts: {caf\u00e9: {}}\n".encode("latin-1"))
        words = "the file is not UTF-8 text (byte 11 is invalid); save it as UTF-8"
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value) == f"{path.resolve()}: {words}"
    with pytest.raises(MatrixError) as matrix_caught:  # the matrix loader says the same of the same file
        load_matrix(path.resolve())
    assert str(matrix_caught.value) == str(caught.value)


def test_a_missing_inventory_says_so(tmp_path):
    with pytest.raises(InventoryError, match="cannot read the hosts inventory"):
        load_inventory(tmp_path / "nothing.yaml")


# ------------------------------------------------------------ how a matrix and the options name it


def test_a_hosts_matrix_names_its_inventory_relative_to_itself_and_pins_hosts_by_provider(tmp_path):
    from pytest_gpubench.cloud.provider import Constraints
    from pytest_gpubench.matrix.cells import load_cells

    (tmp_path / "lab").mkdir()
    matrix = tmp_path / "lab" / "gpubench_lab.yaml"
    matrix.write_text("cloud: hosts\nhosts: ../hosts.yaml\nreuse: group\n"
                      "matrix:\n  - {gpu: RTX 4090, providers: [hosts, lab1, ada], model: qwen2:7b}\n")
    cells = load_cells(matrix)
    assert [cell.provider for cell in cells] == ["hosts", "lab1", "ada"]
    assert {cell.hosts_file for cell in cells} == {str((tmp_path / "hosts.yaml").resolve())}
    # A GPU lease, not a rented session: each cell holds only its own GPUs.
    assert {cell.reuse for cell in cells} == {"cell"}
    assert Constraints.for_cell(cells[1]).hosts_file == cells[1].hosts_file


def test_a_host_name_is_no_provider_of_a_rented_cloud(tmp_path):
    from pytest_gpubench.errors import MatrixError
    from pytest_gpubench.matrix.cells import load_cells

    matrix = tmp_path / "gpubench_x.yaml"
    matrix.write_text("matrix:\n  - {gpu: RTX 4090, provider: lab1, model: qwen2:7b}\n")
    with pytest.raises(MatrixError, match="unknown provider 'lab1'"):
        load_cells(matrix)
    matrix.write_text("cloud: hosts\nmatrix:\n  - {gpu: RTX 4090, provider: 'lab 1', model: qwen2:7b}\n")
    with pytest.raises(MatrixError, match="a host's name or a tag"):
        load_cells(matrix)


def test_the_hosts_options_resolve_and_the_lease_ttl_follows_the_sandbox_clock():
    from pytest_gpubench.settings import MIN_GPU_LEASE_SECONDS, resolve

    settings = resolve({"hosts": "lab/hosts.yaml"}, {"GPUBENCH_GPU_LEASE_TTL": "5m",
                                                    "GPUBENCH_KNOWN_HOSTS": "/tmp/kh"}, lambda name: None)
    assert (settings.hosts, settings.gpu_lease_seconds, settings.known_hosts) == ("lab/hosts.yaml", 300.0, "/tmp/kh")
    sandboxed = resolve({"sandbox": True}, {}, lambda name: None)
    assert sandboxed.gpu_lease_seconds == MIN_GPU_LEASE_SECONDS  # 120 s x 0.02, but never below the floor
