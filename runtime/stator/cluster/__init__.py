"""Where a job's Spark runs: the session (local or Kubernetes), the executors it has, and
which executor holds which subtask's local state (state-aware placement)."""
