"""Device usage (issue 46): every task's device-seconds, from its placement to its end, by device kind, attributed to
its job's owner and the job's cluster. recording.py adds a task's seconds to the daily rollup (UsageDay) once, in the
transaction that ends it, and decay.py the same seconds, decayed, to fair share's memory of the owner's use (the
scheduler orders by it: orchestrator/core/fair_share.py); days.py splits an interval at UTC midnights (plain
Python); periods.py is the one rule for a period a reader may ask for; reads.py answers per user, group or cluster
per day from the rollup, plus what running tasks have held so far, for the API, the page and the CLI, and the
all-time totals Prometheus counts.

Groups are not recorded: a group's usage is its members' at read time (auth groups as they are now).

May import: contracts, core, models, plumbing."""
