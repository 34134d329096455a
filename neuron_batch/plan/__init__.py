"""`neuron-batch plan`: which instances, how many and laid out how, finish a batch job by a
deadline for the least money (run.py reads top-down; grid.py the options, bounds.py their lower
bounds, search.py the pruning, report.py and plot.py the results, job.py the settings)."""
