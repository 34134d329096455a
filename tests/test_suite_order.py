"""The order the suite's files are handed to its two workers (tests/suite_order.py): the slow files
first, named as they are."""

from __future__ import annotations

from pathlib import Path

from suite_order import SLOW_FILES, slow_files_first

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_file_is_there():
    """A renamed or removed file would drop out of the order without a word."""
    assert all((ROOT / name).is_file() for name in SLOW_FILES)


def test_the_slow_files_go_first_in_their_order_then_most_tests_first():
    queue = {"tests/a.py": {"x": False},
             SLOW_FILES[1]: {"y": False},
             "tests/b.py": {"p": False, "q": False, "r": False},
             SLOW_FILES[0]: {"z": False},
             "tests/c.py": {"s": False, "t": False}}
    assert slow_files_first(queue) == [SLOW_FILES[0], SLOW_FILES[1], "tests/b.py",
                                       "tests/c.py", "tests/a.py"]


def test_the_suite_runs_without_xdist():
    """The vLLM matrix's environments (scripts/vllm_matrix.sh) hold pytest without xdist: the
    conftest's xdist hook must not stop them from collecting (stop 57's CI: every release
    'exited 3' or ran no tests)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "-k", "slow_files_go_first",
                           str(Path(__file__))],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
