"""The one error tree: every error the package raises on purpose is defined in
errors.py and drawn in its docstring (the sandbox, an emulated outside world, keeps
its own)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from pytest_gpubench import errors
from pytest_gpubench.errors import Stage

PACKAGE = Path(errors.__file__).parent
ELSEWHERE = ("sandbox",)  # the emulated cloud and its stand-ins: their errors are theirs


def test_no_error_class_is_defined_outside_errors_py():
    exception_names = {name for name, value in vars(errors).items()
                       if inspect.isclass(value) and issubclass(value, BaseException)}
    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name == "errors.py" or relative.parts[0] in ELSEWHERE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue  # a private class is control flow inside its module, not an error users meet
            bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
            if bases & (exception_names | {"Exception", "BaseException", "ValueError", "RuntimeError"}):
                found.append(f"{relative}: {node.name}")
    assert found == []


def test_every_error_is_drawn_in_the_tree_with_its_parent():
    tree = errors.__doc__
    for name, value in vars(errors).items():
        if inspect.isclass(value) and issubclass(value, errors.GpubenchError) and value is not errors.GpubenchError:
            assert f"── {name} " in tree, f"{name} is missing from errors.py's docstring"
            parent = next(base for base in value.__mro__[1:] if issubclass(base, errors.GpubenchError))
            # Drawn below its parent: the parent's line comes first.
            assert tree.index(f" {parent.__name__} ") < tree.index(f"── {name} ")


def test_every_stage_error_knows_its_stage():
    assert errors.BudgetRefused("cap").stage is errors.Stage.PROVISION
    assert errors.HostKeyChanged("h", 22, "SHA256:x").stage is errors.Stage.SSH_CONNECT
    assert errors.ThresholdMissed("slow").stage is errors.Stage.RESULTS
    assert errors.ResultsInvalid("NaN", Path("raw.json")).stage is errors.Stage.RESULTS
    assert errors.InstanceLost(errors.Stage.BENCHMARK, "gone").hint == errors.LOST_HINT


def test_remote_stderr_reaches_failure_messages_without_escape_sequences_or_line_breaks(tmp_path):
    """Issue 21 item 13: an instance's stderr (a real process here) is quoted in the failure
    message, the terminal's and JUnit's text (``repr_failure``), through the progress files' rule."""
    import asyncio
    import types

    from pytest_gpubench.errors import GpubenchError, RemoteCommandError
    from pytest_gpubench.plugin.collect import describe_failure
    from pytest_gpubench.remote.local import LocalShell
    from pytest_gpubench.store.progress import ProgressWriter, read_progress

    hostile = r"printf '\033]0;owned\007\033[2J\033[31mboom\033[0m\nsecond\r\n\342\200\256gnp.exe' >&2; exit 3"

    async def run() -> RemoteCommandError:
        shell = LocalShell(tmp_path / "home")
        with pytest.raises(RemoteCommandError) as caught:
            await shell.run(hostile, stage=Stage.MODEL_PULL, what="ollama pull", timeout=30)
        await shell.close()
        return caught.value

    error = asyncio.run(run())
    item = types.SimpleNamespace(stash={})
    shown = [str(error), error.stderr_tail, describe_failure(error, item),
             describe_failure(GpubenchError("bad \x1b[1;1Hanswer\nfrom the API", hint="\x1b]8;;x\x07y"), item)]
    for text in shown:
        assert not any(ord(ch) < 32 or 0x7F <= ord(ch) <= 0x9F or ch == "\u202e" for ch in text), repr(text)
    assert str(error) == "ollama pull exited 3: boom second gnp.exe"
    assert shown[3] == "bad answer from the API (y)"
    with ProgressWriter(tmp_path / "p.log") as progress:  # the same text as the progress file's
        progress.error(error.stage, str(error))
    assert read_progress(tmp_path / "p.log")[-1].message == str(error), read_progress(tmp_path / "p.log")
