"""What crosses between the driver and the tasks: the epoch's spec (driver -> tasks) and the
tasks' reports (tasks -> driver)."""
