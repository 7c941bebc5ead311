"""Where state lives: subtasks placed on executors, their local and standby copies,
and restoring from them."""
