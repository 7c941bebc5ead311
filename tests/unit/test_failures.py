"""A failed epoch is classified (retry, fall back, end the job) and summarized as the user's
exception, not the Py4J error around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.checkpoint.metadata import CheckpointMetadata
from stator.driver.failures import Kind, classify, short_error
from stator.errors import ConfigError, StorageError
from stator.lineage import Target
from stator.locality.restore import RestoreError
from stator.savepoint.metadata import SavepointMetadata
from stator.storage import open_store
from stator.tasks.user_errors import UserFunctionError, summarize, user_code


def _raised_in_user_code(key: object = "u1") -> UserFunctionError:
    def process(record: dict[str, int]) -> int:
        return record["price"]

    with pytest.raises(UserFunctionError) as caught, user_code("totals", 3, lambda: key):
        process({})
    return caught.value


def _as_spark_reports_it(exc: Exception, attempts: int) -> Exception:
    """What the driver gets from PySpark: the worker's traceback inside Java text."""
    return RuntimeError(
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD."
        f"collectAndServe.\n: org.apache.spark.SparkException: Job aborted due to stage "
        f"failure: Task 0 in stage 1.0 failed {attempts} times, most recent failure: "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in main\n'
        f"stator.tasks.user_errors.UserFunctionError: {exc}\n\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)\n"
    )


def test_user_error_names_type_message_operator_key_and_epoch() -> None:
    exc = _raised_in_user_code()
    assert exc.summary == "KeyError: 'price' in operator 'totals' key 'u1' epoch 3"
    assert 'return record["price"]' in str(exc)  # the user's traceback travels with it
    assert "user_errors.py" not in str(exc).split("---")[2]  # from the user's frame down


def test_long_keys_and_messages_are_cut() -> None:
    text = summarize(ValueError("x" * 1000), "op", 1, "k" * 500)
    key = text.split(" key ", 1)[1].split(" epoch ")[0]
    assert len(key) == 80 and key.endswith("...")
    assert len(text) < 450
    assert summarize(RuntimeError(), "op", 2) == "RuntimeError in operator 'op' epoch 2"


def test_stator_errors_pass_through_user_code() -> None:
    with pytest.raises(ConfigError), user_code("op", 1):
        raise ConfigError("bad")


def test_user_error_after_spark_retries_ends_the_job() -> None:
    failure = classify(_as_spark_reports_it(_raised_in_user_code(), 4), None, None)
    assert failure.kind is Kind.FATAL
    assert failure.summary == "KeyError: 'price' in operator 'totals' key 'u1' epoch 3"
    assert "all 4 attempts" in failure.reason
    assert failure.user_traceback and 'return record["price"]' in failure.user_traceback


def test_user_error_without_spark_retries_is_retried_once() -> None:
    exc = _as_spark_reports_it(_raised_in_user_code(), 1)
    first = classify(exc, None, None)
    assert first.kind is Kind.RETRY
    again = classify(exc, None, first)
    assert again.kind is Kind.FATAL and "raised again" in again.reason
    other = classify(_as_spark_reports_it(_raised_in_user_code("u2"), 1), None, first)
    assert other.kind is Kind.RETRY  # another key: maybe not the same cause


def test_bad_config_and_incompatible_state_are_fatal() -> None:
    assert classify(ConfigError("parallelism"), None, None).kind is Kind.FATAL
    text = RuntimeError(
        "Py4JJavaError ... PythonException: Traceback (most recent call last):\n"
        '  File "keyed.py", line 98, in _verify_declared\n'
        "    raise StateCompatibilityError(\n"
        "stator.errors.StateCompatibilityError: operator 'x' restored state ['extra'] that "
        "the code no longer declares\n\n\tat org.apache.spark.api.python.X(x.scala:1)"
    )
    failure = classify(text, None, None)
    assert failure.kind is Kind.FATAL
    assert failure.summary == (
        "StateCompatibilityError: operator 'x' restored state ['extra'] that the code no "
        "longer declares"
    )


def test_restore_errors_fall_back_for_checkpoints_and_end_the_job_for_savepoints(
    tmp_path: Path,
) -> None:
    store = open_store(f"file://{tmp_path}")
    exc = RuntimeError(f"Py4JJavaError: ... {RestoreError(0, 'kg-00001.bin: bad zlib data')}")
    savepoint = SavepointMetadata("j", 3, 0, 32, {}, {}, 0, "zlib")
    failure = classify(exc, Target(savepoint, store), None)
    assert failure.kind is Kind.FATAL and "cannot be restored" in failure.reason
    unreachable = RuntimeError(
        "Py4JJavaError: ... stator.errors.StorageError: S3 endpoint http://minio:9000 is "
        "unreachable\n\nThe above exception was the direct cause of the following exception:\n"
        f"{RestoreError(0, 'S3 endpoint http://minio:9000 is unreachable')}"
    )
    assert classify(unreachable, Target(savepoint, store), None).kind is Kind.RETRY
    checkpoint = CheckpointMetadata(2, 3, "j", 0, 32, True, {}, {}, {}, 0)
    assert classify(exc, Target(checkpoint, store), None).kind is Kind.FALL_BACK


def test_infrastructure_failures_are_retried() -> None:
    for exc in (
        RuntimeError("Py4JJavaError: ExecutorLostFailure (executor 1 exited)"),
        StorageError("S3 endpoint http://x is unreachable"),
        ConnectionResetError("Connection reset by peer"),
    ):
        assert classify(exc, None, None).kind is Kind.RETRY


def test_short_error_prefers_the_user_summary() -> None:
    text = str(_as_spark_reports_it(_raised_in_user_code(), 4))
    assert short_error(text) == "KeyError: 'price' in operator 'totals' key 'u1' epoch 3"


def test_other_worker_errors_are_summarized_by_their_python_exception() -> None:
    text = (
        "Py4JJavaError: An error occurred while calling o87.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "2.0 failed 4 times, most recent failure: Lost task 0.3: "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/kafka.py", line 3, in read\n'
        "    raise ConnectionError('broker kafka:9092 is unreachable')\n"
        "ConnectionError: broker kafka:9092 is unreachable\n"
        "\n\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)\n"
    )
    failure = classify(RuntimeError(text), None, None)
    assert failure.kind is Kind.RETRY
    assert failure.summary == "ConnectionError: broker kafka:9092 is unreachable"
    assert short_error("Py4JJavaError: lost\n: executor 1 exited") == (
        "Py4JJavaError: lost : executor 1 exited"
    )
