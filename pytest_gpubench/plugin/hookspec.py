"""Hooks for users: implement them in a ``conftest.py`` or a plugin (docs/hooks.md).

Registered by ``pytest_addhooks`` (``plugin/hooks.py``) in every run, so this module
stays light: pytest and annotations only. Each hook is called from
:mod:`.fixtures`, which turns its answer into the plugin's own values; the work
itself is in plain modules (``cloud/offers.py``, ``matrix/adjust.py``,
``measure/finished.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ..cloud.provider import Offer
    from ..matrix.cells import Cell
    from ..matrix.workload import Workload
    from ..measure.finished import FinishedCell


@pytest.hookspec(firstresult=True)
def pytest_gpubench_select_offer(cell: Cell, eligible: list[Offer], chosen: Offer,
                                 config: pytest.Config) -> Offer | None:
    """Choose the offer to rent for ``cell`` among the eligible ones (stage ``inventory``).

    :param cell: the matrix cell, command-line overrides applied.
    :param eligible: the offers that meet the cell's constraints (GPU, provider,
        VRAM, availability confidence, price cap), in the plugin's preference
        order: cheapest first, then the more confident.
    :param chosen: the offer the plugin would rent (``eligible[0]``).
    :param config: the pytest config.
    :return: one offer of ``eligible``, or None to keep ``chosen``. Returning an
        offer that is not eligible fails the cell at ``inventory``.

    If the chosen offer fails to come up, failover tries the others in the
    plugin's order. Not called when the cell reuses a session its reuse group
    already rented (there is no offer to choose then).
    """


@pytest.hookspec(firstresult=True)
def pytest_gpubench_adjust_workload(cell: Cell, workload: Workload, config: pytest.Config) -> Workload | None:
    """Change how ``cell`` is benchmarked, before anything is rented for it.

    :param cell: the matrix cell, command-line overrides applied.
    :param workload: its workload (``cell.workload``): duration, max tokens,
        prompts, warm-up, runs...
    :param config: the pytest config.
    :return: the workload to run (``workload.model_copy(update={...})`` or a dict
        of its fields), or None to keep it. It is validated like a matrix file's;
        its ``concurrency`` and ``rate`` must stay (they are the cell's identity).

    The run's order, reuse groups and estimates were computed at collection from
    the matrix's workload; only the cell's own benchmark sees the change.
    """


@pytest.hookspec
def pytest_gpubench_cell_finished(finished: FinishedCell, config: pytest.Config) -> Any:
    """Receive each cell's end once it is recorded, for example to push it to a dashboard.

    :param finished: the cell, its status (``success``, ``partial``, ``failed``,
        ``skipped``), failure stage and message, its BenchmarkResult (None when
        nothing was measured), its figures as plain JSON values and its progress file.
    :param config: the pytest config.

    Called in the process that ran the cell (an xdist worker under ``-n``), after
    its sessions are released and its manifest row, progress file and report
    properties are written; every implementation is called. An exception raised
    here is the cell's teardown error: what was recorded stays recorded.
    """
