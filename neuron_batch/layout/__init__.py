"""Pure planning, below run, bench and plan: the exact bucket optimiser, lower bounds on a
layout's time, the rules of a split by length and where its parts run."""
