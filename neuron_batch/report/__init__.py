"""Stage 3: scheduler records -> metrics -> report dict -> terminal summary / Prometheus text
(pure: no vLLM import)."""
