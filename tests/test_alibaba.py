"""The Alibaba cluster-trace-v2018 loader, checked against the fixture's raw rows read independently,
and its honesty rule: whole-run summaries and samples after t never reach a feature at t."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import math
import shutil
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from straggler.core.jobtrace import JobTrace
from straggler.traces.alibaba2018 import FEATURE_NAMES, MACHINE_FEATURES, load_alibaba2018
from straggler.traces.loading import FORMATS, load_traces

FIXTURE = Path(__file__).parent / "fixtures" / "alibaba-2018"
TABLES = ("batch_task.csv", "batch_instance.csv", "machine_usage.csv")
SUMMARY_COLUMNS = (10, 11, 12, 13)  # cpu_avg, cpu_max, mem_avg, mem_max
Rows = list[list[str]]


def _read(path: Path) -> Rows:
    with path.open(newline="") as handle:
        return [row for row in csv.reader(handle) if row]


def _write(path: Path, rows: Rows) -> None:
    path.write_text("".join(",".join(row) + "\n" for row in rows))


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "trace"
    root.mkdir()
    for name in TABLES:
        shutil.copy(FIXTURE / name, root / name)
    return root


def _edit(root: Path, table: str, change: Callable[[Rows], Rows]) -> None:
    _write(root / table, change(_read(root / table)))


def _load(root: Path, min_tasks: int = 10) -> dict[str, JobTrace]:
    return {t.job_id: t for t in load_alibaba2018(root, min_tasks=min_tasks, progress=False)}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def _num(text: str) -> float:
    return float(text) if text.strip() else math.nan


@pytest.fixture(scope="module")
def traces() -> dict[str, JobTrace]:
    return _load(FIXTURE)


# --------------------------------------------------------------------------------------------------
# What the raw rows say, computed without the loader


def _last_attempts(root: Path) -> dict[tuple[str, str], dict[str, list[str]]]:
    """Per (job_name, task_name), per instance name, the row with the highest seq_no."""
    rows_of: dict[tuple[str, str, str], Rows] = defaultdict(list)
    for row in _read(root / "batch_instance.csv"):
        rows_of[(row[2], row[1], row[0])].append(row)
    groups: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(dict)
    for (job, task, name), rows in rows_of.items():
        groups[(job, task)][name] = max(rows, key=lambda r: int(r[8]))
    return groups


def _plans(root: Path) -> dict[str, tuple[float, float, float]]:
    """job_id -> (plan_cpu, plan_mem, instance_num)."""
    return {f"{r[2]}/{r[0]}": (float(r[7]), float(r[8]), float(r[1])) for r in _read(root / "batch_task.csv")}


def _samples(root: Path) -> dict[str, list[tuple[float, float, list[float]]]]:
    """Per machine, (window start, time_stamp, values) in time order; invalid values are NaN."""
    by_machine: dict[str, list[tuple[float, list[float]]]] = defaultdict(list)
    for row in _read(root / "machine_usage.csv"):
        if float(row[1]) <= 0:
            continue
        values = [_num(x) for x in row[2:9]]
        for c, name in enumerate(MACHINE_FEATURES):
            high = math.inf if name == "mkpi" else 100.0
            if not 0.0 <= values[c] <= high:
                values[c] = math.nan
        by_machine[row[0]].append((float(row[1]), values))
    out: dict[str, list[tuple[float, float, list[float]]]] = {}
    for machine, samples in by_machine.items():
        samples.sort(key=lambda s: s[0])
        starts = [samples[0][0] - 10.0] + [s[0] for s in samples[:-1]]
        out[machine] = [(a, t, v) for a, (t, v) in zip(starts, samples, strict=True)]
    return out


def _busy(root: Path) -> dict[str, list[tuple[float, float]]]:
    """Per machine, every attempt that started inside the trace: (start, end or +inf)."""
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in _read(root / "batch_instance.csv"):
        start, end = _num(row[5]), _num(row[6])
        if start > 0 and row[7]:
            busy[row[7]].append((start, end if end > 0 and end >= start else math.inf))
    return busy


def _machine_reference(
    samples: list[tuple[float, float, list[float]]],
    busy: list[tuple[float, float]],
    start: float,
    end: float,
    t: float,
) -> list[float]:
    """Time-weighted means of the samples with start < time_stamp <= t and time_stamp < end, then the
    mean count of other attempts running at those samples."""
    used = [(a, ts, v) for a, ts, v in samples if start < ts <= t and not ts >= end]
    out = []
    for c in range(len(MACHINE_FEATURES)):
        pairs = [(ts - a, v[c]) for a, ts, v in used if not math.isnan(v[c])]
        weight = sum(w for w, _ in pairs)
        out.append(sum(w * x for w, x in pairs) / weight if weight > 0 else math.nan)
    counts = [(ts - a, sum(1 for s, e in busy if s <= ts < e) - 1) for a, ts, _ in used]
    weight = sum(w for w, _ in counts)
    out.append(sum(w * x for w, x in counts) / weight if weight > 0 else math.nan)
    return out


# --------------------------------------------------------------------------------------------------
# Structure


def test_groups_selected_by_finished_instances(traces: dict[str, JobTrace]) -> None:
    assert list(traces) == ["j_1001/M1", "j_1002/M1", "j_1001/R2_1"]  # by first start
    assert len(_load(FIXTURE, min_tasks=8)) == 4  # j_1003's task has exactly 8 finished
    assert len(_load(FIXTURE, min_tasks=9)) == 3
    largest = load_alibaba2018(FIXTURE, min_tasks=10, max_jobs=2, progress=False)
    assert [t.job_id for t in largest] == ["j_1001/M1", "j_1002/M1"]  # 33 and 29 finished, not 20
    assert load_alibaba2018(FIXTURE, min_tasks=100, progress=False) == []
    for trace in traces.values():
        assert trace.feature_names == FEATURE_NAMES
        assert trace.meta["source"] == "alibaba-2018"
        assert f"{trace.meta['job_name']}/{trace.meta['task_name']}" == trace.job_id
        assert np.all(np.diff(trace.checkpoints) == 60.0) and np.all(trace.checkpoints % 60 == 0)


def test_instances_runs_and_outcomes_come_from_the_last_attempt(traces: dict[str, JobTrace]) -> None:
    groups = _last_attempts(FIXTURE)
    plans = _plans(FIXTURE)
    for trace in traces.values():
        job, task = trace.job_id.split("/")
        rows = groups[(job, task)]
        started = {name: r for name, r in rows.items() if _num(r[5]) > 0}
        assert sorted(trace.task_ids) == sorted(started)
        assert trace.excluded_tasks == len(rows) - len(started)
        assert trace.expected_tasks == plans[trace.job_id][2]
        for i, name in enumerate(trace.task_ids):
            row = started[name]
            start, end = float(row[5]), float(row[6])
            assert trace.start[i] == start and trace.machine_ids[i] == row[7]
            is_finished = row[4] == "Terminated" and end > start
            assert trace.finished[i] == is_finished
            if is_finished:
                assert trace.latency[i] == end - start
            else:
                assert np.isnan(trace.latency[i])
            if end > 0:
                assert trace.end[i] == end
            else:
                assert np.isnan(trace.end[i])

    first = traces["j_1001/M1"]
    counts = (first.n_tasks, first.excluded_tasks, first.expected_tasks, int(first.scored.sum()))
    assert counts == (38, 2, 40, 33)
    statuses = {r[4] for r in groups[("j_1001", "M1")].values()}
    assert {"Failed", "Running", "Interrupted", "Cancelled", "Waiting", "Ready"} <= statuses
    running = [i for i, name in enumerate(first.task_ids) if groups[("j_1001", "M1")][name][4] == "Running"]
    assert len(running) == 1 and np.isnan(first.end[running[0]])
    second = traces["j_1002/M1"]
    assert (second.n_tasks, second.expected_tasks) == (29, 30)  # the plan, not the rows


def test_the_retried_instance_uses_its_highest_seq_no(traces: dict[str, JobTrace]) -> None:
    rows = [r for r in _read(FIXTURE / "batch_instance.csv") if r[9] == "2"]
    assert len(rows) == 2 and rows[0][8] == "2" and rows[1][8] == "1"  # the retry is written first
    retry, failed = rows
    trace = traces[f"{retry[2]}/{retry[1]}"]
    i = trace.task_ids.index(retry[0])
    assert trace.start[i] == float(retry[5]) != float(failed[5])
    assert trace.machine_ids[i] == retry[7] != failed[7]
    assert trace.finished[i] and trace.latency[i] == float(retry[6]) - float(retry[5])


# --------------------------------------------------------------------------------------------------
# Feature values


def test_plan_features_are_the_batch_task_plan(traces: dict[str, JobTrace]) -> None:
    plans = _plans(FIXTURE)
    for trace in traces.values():
        expected = np.asarray(plans[trace.job_id])
        for X in [*trace.running_features, trace.finish_features[trace.finished]]:
            np.testing.assert_allclose(X[:, :3], np.broadcast_to(expected, (len(X), 3)), rtol=1e-12)


def test_machine_features_are_means_of_the_samples_reported_in_the_run(traces: dict[str, JobTrace]) -> None:
    samples, busy = _samples(FIXTURE), _busy(FIXTURE)
    checked = 0
    for trace in traces.values():
        for t, index, X in zip(trace.checkpoints, trace.running_index, trace.running_features, strict=True):
            for i, row in zip(index, X, strict=True):
                m = trace.machine_ids[i]
                want = _machine_reference(samples[m], busy[m], trace.start[i], trace.end[i], float(t))
                np.testing.assert_allclose(row[3:], want, rtol=1e-9, atol=1e-12)
                checked += 1
        for i in np.flatnonzero(trace.finished):
            m = trace.machine_ids[i]
            end = float(trace.end[i])
            want = _machine_reference(samples[m], busy[m], trace.start[i], end, end)
            np.testing.assert_allclose(trace.finish_features[i, 3:], want, rtol=1e-9, atol=1e-12)
    assert checked > 500
    everything = np.vstack([X for trace in traces.values() for X in trace.running_features])
    assert np.isnan(everything[:, 5]).any() and np.isfinite(everything[:, 5]).any()  # m_106: no mem_gps
    assert np.nanmax(everything[:, -1]) > 3  # instances share machines


# --------------------------------------------------------------------------------------------------
# Honesty


def test_whole_run_summaries_change_no_feature(tmp_path: Path, traces: dict[str, JobTrace]) -> None:
    root = _copy(tmp_path)
    rng = np.random.default_rng(0)

    def scramble(rows: Rows) -> Rows:
        for row in rows:
            for c in SUMMARY_COLUMNS:
                row[c] = f"{rng.uniform(0, 500):.2f}"
        return rows

    _edit(root, "batch_instance.csv", scramble)
    assert _read(root / "batch_instance.csv") != _read(FIXTURE / "batch_instance.csv")
    changed = _load(root)
    assert list(changed) == list(traces)
    for job_id, trace in traces.items():
        other = changed[job_id]
        assert all(_same(a, b) for a, b in zip(trace.running_features, other.running_features, strict=True))
        assert _same(trace.finish_features, other.finish_features)


def test_samples_after_a_checkpoint_do_not_change_it(tmp_path: Path, traces: dict[str, JobTrace]) -> None:
    t_k = float(traces["j_1001/M1"].checkpoints[5])
    root = _copy(tmp_path)
    rng = np.random.default_rng(1)

    def scramble_after(rows: Rows) -> Rows:
        for row in rows:
            if float(row[1]) > t_k:
                row[2:] = [f"{rng.uniform(0, 100):.2f}" if x else "" for x in row[2:]]
        return rows

    _edit(root, "machine_usage.csv", scramble_after)
    changed = _load(root)
    later_differs = False
    for job_id, trace in traces.items():
        other = changed[job_id]
        for t, a, b in zip(trace.checkpoints, trace.running_features, other.running_features, strict=True):
            if t <= t_k:
                assert _same(a, b), f"{job_id} at {t} moved with samples after {t_k}"
            else:
                later_differs |= not _same(a, b)
        done_by_t = trace.finished & (trace.end <= t_k)
        assert _same(trace.finish_features[done_by_t], other.finish_features[done_by_t])
    assert later_differs  # the scramble did reach the features it may reach


def test_a_sample_before_a_checkpoint_changes_it(tmp_path: Path, traces: dict[str, JobTrace]) -> None:
    trace = traces["j_1001/M1"]
    k = 5
    t_k = float(trace.checkpoints[k])
    i = int(trace.running_index[k][0])
    machine, start = trace.machine_ids[i], float(trace.start[i])
    samples = [s for s in _samples(FIXTURE)[machine] if start < s[1] <= t_k]
    stamp = samples[len(samples) // 2][1]
    root = _copy(tmp_path)

    def bump(rows: Rows) -> Rows:
        for row in rows:
            if row[0] == machine and float(row[1]) == stamp:
                row[3] = "0" if float(row[3]) > 50 else "100"  # mem_util_percent
        return rows

    _edit(root, "machine_usage.csv", bump)
    before, after = trace.running_features[k], _load(root)["j_1001/M1"].running_features[k]
    row = list(trace.running_index[k]).index(i)
    column = FEATURE_NAMES.index("mem_util_percent")
    assert before[row, column] != after[row, column]
    untouched = [c for c in range(len(FEATURE_NAMES)) if c != column]
    assert _same(before[:, untouched], after[:, untouched])


def test_finish_features_use_only_samples_strictly_before_the_end(tmp_path: Path) -> None:
    trace = _load(FIXTURE)["j_1001/R2_1"]
    i = int(np.flatnonzero(trace.finished)[0])
    name, machine = trace.task_ids[i], trace.machine_ids[i]
    end = 10.0 * math.ceil(float(trace.end[i]) / 10.0) + 10.0  # on a sample tick
    root = _copy(tmp_path)

    def move_end(rows: Rows) -> Rows:
        for row in rows:
            if row[0] == name:
                row[6] = str(int(end))
        return rows

    _edit(root, "batch_instance.csv", move_end)
    base = _load(root)["j_1001/R2_1"].finish_features[i]

    def scramble(at: Callable[[float], bool]) -> np.ndarray:
        def change(rows: Rows) -> Rows:
            for row in rows:
                if row[0] == machine and at(float(row[1])):
                    row[2], row[3] = ("1", "1") if float(row[2]) > 50 else ("99", "99")
            return rows

        _edit(root, "machine_usage.csv", change)
        features = _load(root)["j_1001/R2_1"].finish_features[i]
        shutil.copy(FIXTURE / "machine_usage.csv", root / "machine_usage.csv")
        return features

    assert _same(scramble(lambda ts: ts >= end), base)  # the sample at the finish instant is not used
    assert not _same(scramble(lambda ts: end - 10 <= ts < end), base)


def test_instances_starting_after_t_are_not_counted_at_t(tmp_path: Path, traces: dict[str, JobTrace]) -> None:
    trace = traces["j_1001/M1"]
    k = 5
    t_k = float(trace.checkpoints[k])
    machine = trace.machine_ids[int(trace.running_index[k][0])]
    root = _copy(tmp_path)
    run = ["Terminated", str(int(t_k) + 1), str(int(t_k) + 300), machine, "1", "1"]
    newcomers = [[f"ins_extra{n}", "M1", "j_9999", "1", *run, "10", "10", "0.1", "0.1"] for n in range(5)]
    _edit(root, "batch_instance.csv", lambda rows: rows + newcomers)
    changed = _load(root)["j_1001/M1"]
    column = FEATURE_NAMES.index("machine_instances")
    for t, a, b in zip(trace.checkpoints, trace.running_features, changed.running_features, strict=True):
        if t <= t_k:
            assert _same(a, b)
    assert not _same(trace.running_features[k + 1][:, column], changed.running_features[k + 1][:, column])


# --------------------------------------------------------------------------------------------------
# Files and registration


def test_gzip_files_and_row_order_give_the_same_traces(tmp_path: Path, traces: dict[str, JobTrace]) -> None:
    root = tmp_path / "gz"
    root.mkdir()
    rng = np.random.default_rng(2)
    for name in TABLES:
        rows = _read(FIXTURE / name)
        rows = [rows[j] for j in rng.permutation(len(rows))]
        with gzip.open(root / f"{name}.gz", "wt") as handle:
            handle.write("".join(",".join(row) + "\n" for row in rows))
    loaded = _load(root)
    assert list(loaded) == list(traces)
    for job_id, trace in traces.items():
        other = loaded[job_id]
        assert other.task_ids == trace.task_ids and _same(other.end, trace.end)
        assert all(_same(a, b) for a, b in zip(trace.running_features, other.running_features, strict=True))
        assert _same(trace.finish_features, other.finish_features)


def test_missing_table_is_named(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "machine_usage.csv").unlink()
    (root / "machine_usage.tar.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"machine_usage.*extract the \.tar\.gz"):
        load_alibaba2018(root, min_tasks=10, progress=False)


def test_load_traces_knows_the_format(traces: dict[str, JobTrace]) -> None:
    assert "alibaba-2018" in FORMATS
    loaded = load_traces("alibaba-2018", FIXTURE, min_tasks=10, progress=False)
    assert [t.job_id for t in loaded] == list(traces)
    assert all(_same(a.checkpoints, b.checkpoints) for a, b in zip(loaded, traces.values(), strict=True))
    coarse = load_traces(
        "alibaba-2018", FIXTURE, checkpoint_seconds=120.0, min_tasks=10, max_jobs=1, progress=False
    )
    assert [t.job_id for t in coarse] == ["j_1001/M1"] and np.all(np.diff(coarse[0].checkpoints) == 120.0)
    with pytest.raises(ValueError, match="--trace"):
        load_traces("alibaba-2018", None)


def test_fixture_is_reproducible(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_alibaba_fixture", FIXTURE / "make_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.OUT = tmp_path  # type: ignore[attr-defined]
    module.main()
    for name in TABLES:
        assert (tmp_path / name).read_bytes() == (FIXTURE / name).read_bytes()
