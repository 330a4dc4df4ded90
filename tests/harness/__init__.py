"""The test harness shared by tests, benchmarks and scripts, kept out of the product package.

``fault_scenarios``: the fault scenarios (tests/test_faults.py, bench/faults.py). ``liveview_run``: the
live view beside a closed-loop replay, looked at with headless Chromium (tests/test_liveview.py,
scripts/liveview_screenshot.py). ``small_jobs``: small hand-built jobs. ``consumer_groups``: waiting for
a consumer group to settle. Tests import it as ``harness`` (tests/ is on their path, as for their other
helpers); the bench and script files put tests/ on ``sys.path`` first.
"""
