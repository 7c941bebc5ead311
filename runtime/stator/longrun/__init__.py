"""Long-running tasks: one Spark job whose source and keyed tasks stay up across epochs
(``epoch.tasks: long-running``; docs/DESIGN.md "Latency")."""
