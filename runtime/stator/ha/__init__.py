"""Leader election and fencing: which driver may act for a job."""
