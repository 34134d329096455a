"""One run's state: its settings and workload (`Job`), its run folder (lock, outputs exactly once,
attempts, resume) and the single-engine loop that writes outputs as they finish."""
