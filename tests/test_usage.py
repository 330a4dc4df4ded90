"""The Google 2011 task_usage loader, checked against the raw rows of the fixture read independently."""

from __future__ import annotations

import csv
import gzip
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from straggler.core.jobtrace import JobTrace
from straggler.traces.usage import (
    FEATURE_NAMES,
    TASK_USAGE_COLUMNS,
    USAGE_FEATURES,
    load_google2011_usage,
)

FIXTURE = Path(__file__).parent / "fixtures" / "usage"
EVICT, FAIL, FINISH, SCHEDULE = 2, 3, 4, 1


def _rows(path: Path) -> list[list[str]]:
    rows: list[list[str]] = []
    for part in sorted(path.glob("*.csv.gz")):
        with gzip.open(part, "rt", newline="") as handle:
            rows.extend(csv.reader(handle))
    return rows


def _write(path: Path, rows: Sequence[Sequence[object]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with gzip.open(path / "part-00000-of-00001.csv.gz", "wt", newline="") as handle:
        csv.writer(handle).writerows(rows)


def _events_by_task(root: Path) -> dict[tuple[str, int], list[tuple[float, int, str]]]:
    events: dict[tuple[str, int], list[tuple[float, int, str]]] = defaultdict(list)
    for row in _rows(root / "task_events"):
        events[(row[2], int(row[3]))].append((int(row[0]) / 1e6, int(row[5]), row[4]))
    return events


@pytest.fixture(scope="module")
def traces() -> list[JobTrace]:
    return load_google2011_usage(FIXTURE, checkpoint_seconds=300.0)


def test_jobs_with_too_few_finished_tasks_are_left_out(traces: list[JobTrace]) -> None:
    assert [t.job_id for t in traces] == ["6000000001", "6000000002"]
    assert len(load_google2011_usage(FIXTURE, min_tasks=5)) == 3
    first = load_google2011_usage(FIXTURE, max_jobs=1)
    assert [t.job_id for t in first] == ["6000000001"]  # earliest first start
    for trace in traces:
        assert trace.feature_names == FEATURE_NAMES and len(FEATURE_NAMES) == 15
        assert trace.scored.sum() >= 100


def test_start_end_and_outcome_come_from_the_last_run(traces: list[JobTrace]) -> None:
    events = _events_by_task(FIXTURE)
    for trace in traces:
        for i, task in enumerate(trace.task_ids):
            history = sorted(events[(trace.job_id, int(task))])
            last = max(k for k, (_, kind, _) in enumerate(history) if kind == SCHEDULE)
            assert trace.start[i] == pytest.approx(history[last][0])
            assert trace.machine_ids[i] == history[last][2]
            after = [e for e in history[last + 1 :] if e[1] in (2, 3, 4, 5, 6)]
            if after:
                assert trace.end[i] == pytest.approx(after[0][0])
                assert trace.finished[i] == (after[0][1] == FINISH)
            else:
                assert np.isnan(trace.end[i]) and not trace.finished[i]
    first = traces[0]
    assert first.expected_tasks == 125 and first.excluded_tasks == 3  # scheduled at time 0
    assert not {"0", "1", "2"} & set(first.task_ids)


def test_reruns_use_only_the_last_runs_windows(traces: list[JobTrace]) -> None:
    """Oracle: time-weighted means over raw rows that start at or after the last SCHEDULE."""
    usage: dict[tuple[str, int], list[list[str]]] = defaultdict(list)
    for row in _rows(FIXTURE / "task_usage"):
        usage[(row[2], int(row[3]))].append(row)
    columns = [TASK_USAGE_COLUMNS.index(name) for name in USAGE_FEATURES]
    checked_reruns = 0
    for trace in traces:
        for i, task in enumerate(trace.task_ids):
            if not trace.finished[i]:
                continue
            rows = [r for r in usage[(trace.job_id, int(task))] if int(r[0]) / 1e6 >= trace.start[i] - 1e-9]
            expected = []
            for c in columns:
                pairs = [((int(r[1]) - int(r[0])) / 1e6, float(r[c])) for r in rows if r[c] != ""]
                weight = sum(w for w, _ in pairs)
                expected.append(sum(w * v for w, v in pairs) / weight if weight else np.nan)
            got = trace.finish_features[i, : len(USAGE_FEATURES)]
            np.testing.assert_allclose(got, expected, rtol=1e-9, equal_nan=True)
            checked_reruns += int(task) % 25 in (3, 7)
    assert checked_reruns >= 8


def test_eviction_and_failure_counts_are_those_strictly_before_t(traces: list[JobTrace]) -> None:
    events = _events_by_task(FIXTURE)
    ev, fl = FEATURE_NAMES.index("evictions"), FEATURE_NAMES.index("failures")
    stepped = 0
    for trace in traces:
        for t, idx, x in zip(trace.checkpoints, trace.running_index, trace.running_features, strict=True):
            for row, i in enumerate(idx):
                history = events[(trace.job_id, int(trace.task_ids[i]))]
                assert x[row, ev] == sum(1 for time, kind, _ in history if kind == EVICT and time < t)
                assert x[row, fl] == sum(1 for time, kind, _ in history if kind == FAIL and time < t)
                stepped += int(x[row, ev] + x[row, fl] > 0)
        reruns = [
            i for i, task in enumerate(trace.task_ids) if int(task) % 25 in (3, 7) and trace.finished[i]
        ]
        assert np.all(trace.finish_features[reruns, ev] + trace.finish_features[reruns, fl] == 1)
    assert stepped > 0


def test_windows_ending_after_t_are_not_used(tmp_path: Path, traces: list[JobTrace]) -> None:
    """Mutate every usage row that ends after T: features at checkpoints up to T must not move."""
    cut_s = float(traces[0].checkpoints[2])
    shutil.copytree(FIXTURE / "task_events", tmp_path / "task_events")
    rows = _rows(FIXTURE / "task_usage")
    for row in rows:
        if int(row[1]) / 1e6 > cut_s:
            row[5:17] = [f"{float(v) * 50 + 1:.6g}" if v else v for v in row[5:17]]
    _write(tmp_path / "task_usage", rows)
    mutated = load_google2011_usage(tmp_path, checkpoint_seconds=300.0)

    original, changed = traces[0], mutated[0]
    moved_later = False
    for k, t in enumerate(original.checkpoints):
        a, b = original.running_features[k], changed.running_features[k]
        if t <= cut_s:
            np.testing.assert_array_equal(b, a)
        else:
            moved_later |= not np.allclose(a, b, equal_nan=True)
    assert moved_later  # the mutation does reach later checkpoints
    early = original.finished & (original.end <= cut_s)
    assert early.any()
    np.testing.assert_array_equal(changed.finish_features[early], original.finish_features[early])


def test_tasks_without_reported_windows_have_nan_usage(traces: list[JobTrace]) -> None:
    for trace in traces:
        silent = [i for i, task in enumerate(trace.task_ids) if int(task) % 60 == 29 and trace.finished[i]]
        assert silent
        assert np.isnan(trace.finish_features[silent, : len(USAGE_FEATURES)]).all()
        assert np.isfinite(trace.finish_features[silent, len(USAGE_FEATURES) :]).all()
        assert trace.meta["tasks_without_usage"] == len(silent)
        # just after starting, nothing is reported yet
        k0 = 0
        fresh = trace.running_index[k0][trace.start[trace.running_index[k0]] > trace.checkpoints[k0] - 1.0]
        assert np.isnan(trace.running_features[k0][np.isin(trace.running_index[k0], fresh), :13]).all()


def _tiny_trace(root: Path, usage_rows: list[list[object]], finish_s: float = 500.0) -> None:
    """One job, one task scheduled at 100 s on machine 7, finishing at ``finish_s``."""
    user = "u"
    _write(
        root / "task_events",
        [
            [50_000_000, "", 42, 0, "", 0, user, 0, 9, 0.1, 0.1, 0.0, 0],
            [100_000_000, "", 42, 0, 7, SCHEDULE, user, 0, 9, 0.1, 0.1, 0.0, 0],
            [int(finish_s * 1e6), "", 42, 0, 7, FINISH, user, 0, 9, 0.1, 0.1, 0.0, 0],
        ],
    )
    _write(root / "task_usage", usage_rows)


def test_each_column_lands_in_its_feature(tmp_path: Path) -> None:
    """Column c carries the value c, so every feature must equal its column's position."""
    row: list[object] = [100_000_000, 400_000_000, 42, 0, 7, *range(5, 20)]
    _tiny_trace(tmp_path, [row])
    (trace,) = load_google2011_usage(tmp_path, min_tasks=1, checkpoint_seconds=100.0)
    for f, name in enumerate(USAGE_FEATURES):
        assert trace.finish_features[0, f] == TASK_USAGE_COLUMNS.index(name), name


def test_means_are_weighted_by_window_duration(tmp_path: Path) -> None:
    def row(start_s: float, end_s: float, cpu: float, cpi: str) -> list[object]:
        values: list[object] = ["0.1"] * 15
        values[0], values[10] = cpu, cpi  # mean_cpu_rate, cycles_per_instruction
        return [int(start_s * 1e6), int(end_s * 1e6), 42, 0, 7, *values]

    _tiny_trace(tmp_path, [row(100, 200, 1.0, "2.0"), row(200, 500, 5.0, "")])
    (trace,) = load_google2011_usage(tmp_path, min_tasks=1, checkpoint_seconds=100.0)
    mcu, cpi = USAGE_FEATURES.index("mean_cpu_rate"), USAGE_FEATURES.index("cycles_per_instruction")
    assert trace.finish_features[0, mcu] == pytest.approx((100 * 1.0 + 300 * 5.0) / 400)
    assert trace.finish_features[0, cpi] == pytest.approx(2.0)  # missing values carry no weight
    # checkpoints 200, 300, 400 see only the first window (it ended at 200; the second is still open)
    np.testing.assert_array_equal(trace.checkpoints[:3], [200.0, 300.0, 400.0])
    for k in range(3):
        assert trace.running_features[k][0, mcu] == pytest.approx(1.0)
