"""`neuron-batch plan`: which instances, how many and laid out how, finish a batch job by a
deadline for the least money (run.py reads top-down; options.py the types, grid.py builds the
options, splits.py the split ones, search.py the pruning, report.py and plot.py the results,
job.py each option's settings; their lower bounds are layout/bounds.py)."""
