"""Compare-strategies experiments: creating one (each variant checked up front), submitting its runs as ordinary
jobs, advancing and cancelling (actions.py), and the summary the page and the API both render (summary.py).

May import: contracts, core, limits, models, metrics, jobs, scheduler, submit."""
