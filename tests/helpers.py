"""Small helpers shared by runtime tests."""

from __future__ import annotations

from typing import Any

from stator.api.pipeline import Pipeline
from stator.config import JobConfig, build
from stator.driver.epoch_loop import EpochResult, JobDriver
from stator.driver.status import JobStatus


def with_overrides(config: JobConfig, **sections: dict[str, Any] | Any) -> JobConfig:
    """A copy of ``config`` with nested keys replaced, e.g. epoch={"max_records": 3}."""
    import dataclasses

    data = dataclasses.asdict(config)
    for key, value in sections.items():
        if isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    result: JobConfig = build(JobConfig, data, "")
    return result


def run_job(pipeline: Pipeline, config: JobConfig, spark: Any) -> JobStatus:
    return JobDriver(pipeline, config, spark).run()


def stop_with_savepoint_after(driver: JobDriver, epoch: int) -> JobDriver:
    """Make ``driver`` request a stop-with-savepoint right after ``epoch`` completes."""

    def stop_after(result: EpochResult) -> None:
        if result.epoch == epoch and not result.savepoint:
            driver.request_savepoint(stop=True)

    driver.on_epoch(stop_after)
    return driver
