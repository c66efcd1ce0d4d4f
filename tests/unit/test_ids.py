"""Ids that become path segments (pytest_gpubench/ids.py) and the paths built from them (issue 21
items 8 and 14): a run id or session id from the command line, an API or a shared store never
puts a file outside its folder."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from pytest_gpubench.ids import InvalidId, check_id, is_id, path_under
from pytest_gpubench.run.record import progress_path
from pytest_gpubench.remote.ssh import KeyFile
from pytest_gpubench.store.git_repo import run_dir
from pytest_gpubench.store.progress import ProgressWriter, existing_progress_file

ESCAPES = [".", "..", "...", ".hidden", "../../x", "a/b", "a\\b", "vastai/1", "", "x\n", "é", "a b", "x" * 256]


@pytest.mark.parametrize("text", ESCAPES)
def test_an_id_is_letters_digits_dot_dash_underscore_not_starting_with_a_dot(text):
    assert not is_id(text)
    with pytest.raises(InvalidId, match=r"session id .* is not a valid id: 1-255 letters, digits, '\.', '_' or '-', "
                                        r"not starting with '\.'"):
        check_id(text, "session id")
    with pytest.raises(InvalidId):
        path_under("/srv/folder", "ok", text)


@pytest.mark.parametrize("text", ["3f6c1a52-0000-4000-8000-000000000001", "hosts-lab1-3-ab12cd", "a.b_c-d", "-x",
                                  "20260101T000000Z-abc123", "x" * 255])
def test_ordinary_ids_pass(text):
    assert is_id(text) and check_id(text, "id") == text
    assert path_under("/srv/folder", text) == Path("/srv/folder", text)


@pytest.mark.parametrize("run_id", [".", "..", ".hidden", "../x"])
def test_a_progress_file_and_a_results_folder_never_leave_their_folder(tmp_path, run_id):
    # Item 14: the run id ".." made reports/progress/../<cell>.log and data/runs/../<cell>.json.
    with pytest.raises(InvalidId):
        progress_path(tmp_path / "progress", run_id, "cell")
    with pytest.raises(InvalidId):
        run_dir(run_id)
    assert progress_path(tmp_path / "progress", "r1", "../../etc/x") == tmp_path / "progress" / "r1" / ".._.._etc_x.log"
    assert run_dir("r1") == "r1" and run_dir("claims") == "claims_"


def test_cleanup_finds_a_cells_progress_file_only_under_the_folder_and_never_through_a_symlink(tmp_path):
    folder = tmp_path / "progress"
    outside = tmp_path / "outside"
    outside.mkdir()
    assert existing_progress_file(folder, "r1", "cell") is None  # no run folder: nothing to write to
    (folder / "r1").mkdir(parents=True)
    assert existing_progress_file(folder, "r1", "cell") == (folder / "r1" / "cell.log").resolve()
    assert existing_progress_file(None, "r1", "cell") is None
    assert existing_progress_file(folder, "..", "cell") is None
    (folder / "r1" / "linked.log").symlink_to(outside / "victim")
    assert existing_progress_file(folder, "r1", "linked") is None
    (folder / "r2").symlink_to(outside)
    assert existing_progress_file(folder, "r2", "cell") is None
    (folder / "r1" / "dir.log").mkdir()
    assert existing_progress_file(folder, "r1", "dir") is None
    # A symlink put in the file's place after the check is refused when the file is opened.
    writer = ProgressWriter(folder / "r1" / "linked.log", follow_symlinks=False)
    with pytest.raises(OSError):
        writer.status("CLEANUP")
    writer.close()
    assert not (outside / "victim").exists()


@pytest.mark.parametrize("session_id", ["../x", "vastai/1", "..", ".x"])
def test_a_key_file_named_by_a_bad_session_id_is_refused_and_leaves_nothing(tmp_path, monkeypatch, session_id):
    # Item 8: "../../x" wrote a 0600 key file outside the private folder; "vastai/1" crashed
    # and left an empty gpubench-key-* folder behind.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(InvalidId, match="session id"):
        KeyFile("-----BEGIN " "OPENSSH PRIVATE KEY-----\nabc\n", name=session_id)
    assert os.listdir(tmp_path) == []


def test_a_shared_store_s_run_id_that_is_no_id_is_not_resumed(tmp_path):
    # Item 14 through a store: --gpubench-resume takes the run id from the store ("last").
    from pytest_gpubench.errors import UsageProblem
    from pytest_gpubench.store.manifest import Manifest
    from pytest_gpubench.store.opening import plan_resume

    path = tmp_path / "m.db"
    with Manifest(path) as manifest:
        manifest.start_run("..", argv=[], matrix_files=[], owner=None, api=None)
        manifest.finish_run("..", "failed")
    with pytest.raises(UsageProblem, match=r"--gpubench-resume: the store's run id '\.\.' is not a run id "
                                           r"\(1-64 letters.*\): it cannot be resumed"):
        plan_resume(path, "..")
