"""Stage 4: many runs of one workload. Bucket sweeps and repeats, the exact bucket optimiser,
ranking and the verdict, plots."""
