"""bench/agent_path.py, the worker's decision hash, runs on the handler as it is: a small run twice
gives the same digest, and one of prediction parts (not the digest of nothing)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_agent_path_bench_prints_one_decision_hash_of_real_predictions() -> None:
    done = subprocess.run(
        [sys.executable, "bench/agent_path.py", "--jobs", "1", "--tasks", "200", "--repeat", "2"],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    digests = re.findall(r"^\s+\d+ .* ([0-9a-f]{16})$", done.stdout, flags=re.MULTILINE)
    assert len(digests) == 2, done.stdout
    assert digests[0] == digests[1], "the same records gave different decisions"
    assert digests[0] != hashlib.sha256(b"").hexdigest()[:16], "no prediction part was written"
