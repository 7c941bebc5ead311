"""The autoscaler (``spec.autoscaler``): samples of the job's metrics (``samples.py``), the
decision (``decision.py``), what status keeps of it (``history.py``), and its step in the
reconciler (``autoscaler.py``)."""
