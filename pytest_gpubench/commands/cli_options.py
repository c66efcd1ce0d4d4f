"""The options the ``gpubench`` commands share with the plugin, taken from its one table.

A command names the options it takes by their ``dest`` in :data:`~pytest_gpubench.options.OPTIONS`
(:func:`add_options`): each is the plugin's flag without its ``--gpubench-`` prefix
(``--gpubench-api`` is ``gpubench cleanup --api``), with the same help, metavar and action; an
option's deprecated aliases (``--manifest`` for ``--store``) come with it. Its handler then gets
the ``Settings`` the plugin would build from the same flags, environment and ini file
(:func:`command_settings`: ``settings.resolve`` with the ini file pytest would read here,
:func:`~pytest_gpubench.settings.pytest_ini`), so a value set in pytest.ini, pyproject.toml,
tox.ini or setup.cfg reaches ``gpubench cleanup`` as it reaches a run. A deprecated name that is
used prints one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CommandProblem, UsageProblem
from ..options import ALIASES_OF, OPTIONS_BY_DEST, Option
from ..settings import Settings, deprecations, pytest_ini, resolve

#: Where a parser keeps the dests its command took from the table (``set_defaults``).
SHARED = "gpubench_shared_options"


def add_options(parser: argparse.ArgumentParser, *dests: str, notes: Mapping[str, str] | None = None) -> None:
    """Give ``parser``'s command the table's options ``dests``, and their deprecated aliases.

    ``notes`` adds, per dest, what the option means to this command (appended to the table's help).
    """
    notes = notes or {}
    taken = list(parser.get_default(SHARED) or ())
    for dest in dests:
        opt = OPTIONS_BY_DEST[dest]
        aliases = ALIASES_OF.get(dest, ())
        _add(parser, opt, notes.get(dest))
        for alias in aliases:
            _add(parser, alias, None)
        taken += [dest, *(alias.dest for alias in aliases)]
    parser.set_defaults(**{SHARED: tuple(taken)})


def _add(parser: argparse.ArgumentParser, opt: Option, note: str | None) -> None:
    if opt.deprecated_for:
        text = f"deprecated: the older name of {OPTIONS_BY_DEST[opt.deprecated_for].command_flag}"
    else:
        text = opt.argparse_help + (f"; {note}" if note else "")
    where = [f"${opt.env}"] if opt.env else []
    if opt.ini:
        where.append(f"ini {opt.ini_key}")
    if where and not opt.deprecated_for:
        text += f" [{', '.join(where)}]"
    kwargs: dict[str, Any] = {"dest": opt.dest, "help": text, "default": None}
    if opt.action == "store_true":
        kwargs["action"] = "store_true"
    else:
        kwargs.update(action=opt.action, metavar=opt.metavar)
        if opt.const is not None:
            kwargs.update(nargs="?", const=opt.const)
    parser.add_argument(opt.command_flag, **kwargs)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The shared options given on this command line, by dest (the others are None)."""
    return {dest: getattr(args, dest, None) for dest in getattr(args, SHARED, ())}


def _command_flag(opt: Option) -> str:
    return opt.command_flag


def _warn(args: argparse.Namespace):
    def warn(note: str) -> None:
        print(f"gpubench {args.command}: warning: {note}", file=sys.stderr)

    return warn


def command_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None,
                     directory: Path | None = None) -> Settings:
    """The ``Settings`` of this command: its flags, then ``env`` (default ``os.environ``), then
    the ini file pytest would read in ``directory`` (default: the current one), as a run resolves
    them. A bad value is a ``CommandProblem`` (exit 2) naming where it came from."""
    try:
        return resolve(given(args), os.environ if env is None else env, pytest_ini(directory),
                       flag=_command_flag, warn=_warn(args))
    except UsageProblem as exc:
        raise CommandProblem(str(exc)) from None


def warn_deprecated(args: argparse.Namespace, env: Mapping[str, str] | None = None,
                    directory: Path | None = None) -> None:
    """The deprecation lines alone, for a command that hands its options to pytest (``plan``)."""
    try:
        notes = deprecations(given(args), os.environ if env is None else env, pytest_ini(directory),
                             flag=_command_flag)
    except UsageProblem as exc:
        raise CommandProblem(str(exc)) from None
    for note in notes:
        _warn(args)(note)


def pytest_flags(args: argparse.Namespace) -> list[str]:
    """The shared options given, as the plugin's own flags (``--split-cost 10`` is
    ``--gpubench-split-cost 10``): what ``gpubench plan`` hands to pytest's collection."""
    flags: list[str] = []
    options = given(args)
    for dest, value in options.items():
        opt = OPTIONS_BY_DEST[dest]
        if value in (None, False, []):
            continue
        if opt.deprecated_for:  # said once already (warn_deprecated); pytest gets the one name
            if options.get(opt.deprecated_for) not in (None, False, []):
                continue
            opt = OPTIONS_BY_DEST[opt.deprecated_for]
        if opt.action == "store_true":
            flags.append(opt.flag)
        else:
            for item in value if isinstance(value, list) else [value]:
                flags += [opt.flag, item]
    return flags
