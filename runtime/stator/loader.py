"""Load a pipeline from ``module:function`` or ``path/to/file.py:function``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from .api.pipeline import Pipeline
from .errors import PipelineError


def load_pipeline(ref: str) -> Pipeline:
    module_name, sep, func_name = ref.rpartition(":")
    if not sep or not module_name or not func_name:
        raise PipelineError(
            f"pipeline {ref!r} must be MODULE:FUNCTION (e.g. examples.wordcount:build) or "
            f"path/to/file.py:FUNCTION"
        )
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise PipelineError(f"pipeline file {path} does not exist")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise PipelineError(
                    f"cannot import pipeline module '{module_name}': no module named "
                    f"'{exc.name}' (is its directory on PYTHONPATH? cwd: {Path.cwd()})"
                ) from exc
            raise
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        candidates = sorted(
            n
            for n, v in vars(module).items()
            if callable(v)
            and not n.startswith("_")
            and getattr(v, "__module__", None) == module.__name__
        )
        raise PipelineError(
            f"module '{module_name}' has no function '{func_name}'"
            + (f"; it has: {', '.join(candidates)}" if candidates else "")
        )
    pipeline = func()
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(f"{ref} returned {type(pipeline).__name__}, not a stator Pipeline")
    pipeline.validate()
    return pipeline
