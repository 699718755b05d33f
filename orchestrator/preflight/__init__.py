"""Preflights: a job that would wait for a gang's devices is first run as one small job of its own (its strategy's
single-worker form, a few steps, a time limit) on a free slot, and refused with that run's verdict when it fails.
runs.py makes a preflight at submission (`start`); settling.py turns a preflight's end into its checked job's
(`settle`, asked by every scheduler pass for the jobs that wait for one): passed, refused, or skipped. The rules
(the default, the single-worker form, the bounds, what an end means) are plain Python in orchestrator/core/preflight.py.

May import: core, models, plumbing, diagnosis (a refused job carries its preflight's verdict), jobs."""
