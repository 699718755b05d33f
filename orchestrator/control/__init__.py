"""The control loop over the database: submitting jobs, FIFO gang scheduling, orders to agents, and each job's
lifecycle from placed to final (including restarts and the watchdog's deadline, hang and reaping checks)."""
