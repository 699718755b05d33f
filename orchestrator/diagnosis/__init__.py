"""Why a job failed: the verdict (Job.diagnosis) for a failed, timed out or hung job. The cause task (the first to
fail on its own), what kind of failure it was, in one sentence with what to do, and the peers that failed because of
it. rules.py holds the one table of rules (data), classify.py applies it to the failed attempt's tasks (plain Python,
no Django), store.py reads the tasks and their log tails and saves the verdict (`diagnose`, `current`).

May import: contracts, models, plumbing."""
