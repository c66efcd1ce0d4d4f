"""One "last run" resolution (store/opening.py): the gpubench commands' ``--run`` and
``--gpubench-resume`` name runs alike and word an unknown one alike."""

from __future__ import annotations

import pytest

from pytest_gpubench.commands.cli import main
from pytest_gpubench.errors import UnknownRun, UsageProblem
from pytest_gpubench.store.opening import FLAG, plan_resume
from pytest_gpubench.store.opening import resolve_run
from pytest_gpubench.store.sqlite_store import SqliteStore


def test_an_empty_store_has_no_last_run(tmp_path):
    with SqliteStore.open(tmp_path / "m.db") as store:
        with pytest.raises(UnknownRun, match=r"the manifest .*m\.db has no runs yet"):
            resolve_run(store, "last")


@pytest.mark.parametrize("wanted", ["last", "r1", "nope"])
def test_the_commands_and_resume_resolve_a_run_name_alike(tmp_path, capsys, wanted):
    path = tmp_path / "m.db"
    with SqliteStore.open(path) as store:
        for run_id in ("r1", "r2"):
            store.start_run(run_id, ["pytest"], [])
            store.finish_run(run_id, "failed")
        try:
            expected = resolve_run(store, wanted)
        except UnknownRun as exc:
            expected = exc.message
    status = main(["export", "--store", str(path), "--run", wanted])
    err = capsys.readouterr().err
    try:
        resumed = plan_resume(path, wanted).run_id
    except UsageProblem as exc:
        resumed = exc.message
    if wanted == "nope":
        assert status == 2 and err.strip() == f"gpubench export: error: {expected}"
        assert resumed == f"{FLAG}: {expected}"
    else:
        assert status == 0 and f"of run {expected} to stdout" in err
        assert resumed == expected
