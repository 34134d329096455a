"""Many runs of one workload: bucket sweeps and repeats, the split comparison, ranking and the
verdict, tables, exports and plots."""
