"""The user's pipeline: its graph (``graph.py``), and running it in this process.

Kept apart from the graph because running reaches into the driver, which reads the graph:
the driver and the tasks import ``graph.py`` only, so no import runs in a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .graph import PipelineGraph

if TYPE_CHECKING:
    from ..config import JobConfig
    from ..driver.status import JobStatus


class Pipeline(PipelineGraph):
    """A pipeline a user builds (``Pipeline("name")``, then ``source``, ``key_by``, ...)."""

    def run(self, config: JobConfig | None = None, spark: Any = None) -> JobStatus:
        """Run this pipeline in this process (a notebook, a test, a benchmark) until its
        bounded sources are exhausted and their output committed, it is stopped, or it
        fails; returns the job's final status (``status.state``: ``FINISHED``, ``STOPPED``,
        or an exception for a failure the restart strategy gave up on).

        ``config``: the job config (``stator.load_config``; None: every default, i.e.
        ``local[*]`` Spark and checkpoints under ``/tmp``). ``spark``: a SparkSession to run
        on, left running; None starts one for the job and stops it at the end. Results a
        ``CollectSink`` committed are readable from it afterwards. Unlike ``stator run``, it
        runs no preflight checks and takes no lease."""
        # Imported here: ``import stator`` must not load the driver (and pyspark) in a Python
        # worker or in the operator, which import stator's modules without running a job.
        from ..config import load_config  # noqa: PLC0415
        from ..driver.job import Job  # noqa: PLC0415

        job = Job(self, config if config is not None else load_config(None, []), spark)
        try:
            return job.run()
        finally:
            job.close()
