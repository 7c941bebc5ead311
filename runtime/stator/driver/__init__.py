"""The driver side of a job: the job (``job.py``), a set of failover regions each run by an
epoch loop (``epoch_loop.py``), and what they are made of: planning epochs, running one as a
Spark job, completing checkpoints, recovery and restarts, savepoints, the job's status."""
