"""The order in which the suite's files are handed to its workers (`pytest -n 2 --dist loadfile`,
the README's test command): the slow files first. Used by tests/conftest.py's
`pytest_xdist_make_scheduler`; a module of its own, since every conftest.py is a module named
`conftest`."""

from __future__ import annotations

#: The suite's slowest files, slowest first (their time in the README's two-worker run on
#: 2026-12-06 at 516444b, seconds): handed out before every other file, so that no long file
#: starts late and runs on alone. xdist's own order is by a file's number of tests, which put
#: the Ray replica file (14 tests, 549 s) in at 256 s: it ended 72 s after the other worker's
#: last file, and a later start would have run the suite past 15 minutes. A stale list costs
#: balance only.
SLOW_FILES = ("tests/replicas/test_replicas.py",            # 549 (~150 since -m 'not ray_faults')
              "tests/run/test_run_cli.py",                  # 140
              "tests/test_readme_commands.py",              # 111
              "tests/run/test_signals.py",                  # 77
              "tests/storage/test_s3_run_folder.py",        # 73
              "tests/plan/test_plan.py",                    # 58
              "tests/bench/test_bench.py")                  # 47


def slow_files_first_scheduler(config, log):
    """`--dist loadfile`'s scheduler with SLOW_FILES handed out first, the others after them
    in xdist's own order (most tests first); None (xdist's own) for any other --dist."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlowFilesFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            # (the queue of files is whole at the first hand-out, none given yet; the workers'
            # own collections, which their reports index, are left as they are)
            if not self.ordered:
                self.ordered = True
                for name in slow_files_first(self.workqueue):
                    self.workqueue.move_to_end(name)
            super()._assign_work_unit(node)

    return SlowFilesFirst(config, log)


def slow_files_first(queue):
    """The files of `queue` (file -> its tests) in the order they are handed out: SLOW_FILES
    in theirs, then the others, most tests first (xdist's order)."""
    def rank(name):
        return ((SLOW_FILES.index(name), 0) if name in SLOW_FILES
                else (len(SLOW_FILES), -len(queue[name])))

    return sorted(queue, key=rank)
