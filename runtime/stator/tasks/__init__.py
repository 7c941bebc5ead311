"""What executors run in an epoch: source tasks, keyed tasks with their local state, the
operator runners and the routing of records between them."""
