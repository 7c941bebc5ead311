"""The driver side of a job: the epoch loop (``epoch_loop.py``) and what it is made of:
planning epochs, running one as a Spark job, completing checkpoints, recovery and
restarts, savepoints, the job's status."""
