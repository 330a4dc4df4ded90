"""bench/dask_slow_worker_bound.py's schedules, on jobs small enough to work out by hand: the
copy-only bound the docs quote copies the slow worker's task whenever that ends the job sooner (as
early as a usual worker frees), and never beats a clean cluster."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bound() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # its own imports (dask_work) are beside it
    try:
        spec = importlib.util.spec_from_file_location(
            "dask_slow_worker_bound", BENCH / "dask_slow_worker_bound.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_one_wave_the_slow_workers_task_is_copied_when_a_usual_worker_frees(bound: ModuleType) -> None:
    # each worker takes one 1 s task; the slow one ends at 4 s; a copy from t = 1 s ends at 2 s
    assert bound.first_free([1.0] * 4, [4.0, 1.0, 1.0, 1.0]) == 4.0
    assert bound.best_with_copies([1.0] * 4, 4.0) == 2.0


def test_a_copy_may_start_at_once_the_bound_has_no_detection_lag(bound: ModuleType) -> None:
    # the slow worker takes the 2 s task (8 s there); a usual worker copies it at t = 0 and the
    # other two run the rest: the clean cluster's 2 s, which no policy that must first see the
    # task run slow can match (the bound is generous, never tight)
    tasks = [2.0, 1.0, 1.0, 1.0, 1.0]
    assert bound.first_free(tasks, [4.0, 1.0, 1.0, 1.0]) == 8.0
    assert bound.best_with_copies(tasks, 4.0) == bound.first_free(tasks, [1.0] * 4) == 2.0


def test_no_copy_is_made_when_the_original_ends_first(bound: ModuleType) -> None:
    # with a slow-down of 1 every worker is usual: copying never helps, the bound is Dask's placement
    tasks = [1.5, 0.5, 2.0, 1.0, 0.7, 1.2, 0.3]
    assert bound.best_with_copies(tasks, 1.0) == pytest.approx(bound.first_free(tasks, [1.0] * 4))


def test_copies_lie_between_dask_alone_and_a_clean_cluster(bound: ModuleType) -> None:
    seconds = [1.3, 0.6, 2.2, 0.9, 1.1, 0.4, 1.8, 0.7, 1.0, 2.6, 0.5, 1.4]
    slow = [4.0, 1.0, 1.0, 1.0]
    copies = bound.best_with_copies(seconds, 4.0)
    assert bound.first_free(seconds, [1.0] * 4) <= copies <= bound.first_free(seconds, slow)
