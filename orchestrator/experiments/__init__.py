"""Compare-strategies experiments: creating one (each variant checked up front), submitting its runs as ordinary
jobs, cancelling, and the summary the page and the API both render.

May import: core, models, metrics, jobs, scheduler, submit."""
