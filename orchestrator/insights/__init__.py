"""What the workers' measurements say: input_bound.py (is a worker waiting for its input pipeline?), slow_worker.py
(which worker falls behind the others, with what its host shows). Computed at read time from stored metric points
and host samples; the job page and the API show them (Job.insights may cache them).

May import: contracts, core, models, metrics."""
