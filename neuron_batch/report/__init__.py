"""Scheduler records -> metrics -> report dict -> terminal summary / Prometheus text, what a run
costs, and the report over many replicas' records (pure: no vLLM import)."""
