"""The end-to-end example (e2e_grpo.py) in its own processes: a trainer and two rollout workers."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_grpo_trainer_and_two_workers_stay_byte_equal():
    p = subprocess.run([sys.executable, os.path.join(HERE, "e2e_grpo.py"), "--steps", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    for step in (1, 2, 3):
        for rank in (0, 1):
            assert any(l.startswith("worker %d: step %d v%d byte-equal" % (rank, step, step))
                       for l in lines), p.stdout
    assert sum("published" in l and "published, 0 of" not in l for l in lines) == 3, p.stdout
