"""Load a pipeline from ``module:function``, ``path/to/file.py:function`` or
``path/to/package:function``, so that the driver and Spark's Python workers see the same
module under the same name, whatever the working directory.

Why by name: the pipeline's functions and classes travel to the workers pickled *by
reference* (module name + qualified name), by Spark's cloudpickle for task closures and by the
standard pickle for values kept in state (e.g. a dataclass defined in the pipeline file). A
worker must therefore be able to import the module under the name the driver gave it. So a
file is imported under its real dotted name (``pkg.sub.mod`` if its directory is a package,
else its stem), with its *import root* (the directory above the top package) first on the
driver's ``sys.path``; the driver hands the same root to the workers through the environment
of every Python worker (``driver/spark_session.py``: ``share_python_path``). Pickling the module
by value (``cloudpickle.register_pickle_by_value``) was rejected: it covers closures but not
values the state serializer pickles, nor a pipeline file's imports of its sibling modules.
"""

from __future__ import annotations

import importlib
import site
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .api.graph import PipelineGraph
from .errors import PipelineError

FORMS = (
    "MODULE:FUNCTION (e.g. examples.wordcount:build), path/to/file.py:FUNCTION or "
    "path/to/package:FUNCTION"
)


@dataclass(frozen=True)
class PipelineRef:
    """A parsed pipeline reference: what to import, under which name, from which root."""

    text: str  # as the user gave it
    module: str  # the dotted name the driver and the workers import
    function: str
    root: Path | None  # directory that must be on sys.path; None: importable as it is
    file: Path | None  # the file or package directory given, if any


@dataclass(frozen=True)
class LoadedPipeline:
    pipeline: PipelineGraph
    ref: PipelineRef
    import_root: str | None  # the sys.path entry the module came from: workers need it too


def parse_reference(text: str) -> PipelineRef:
    """Split and check a reference without importing anything."""
    target, sep, func = text.rpartition(":")
    if not sep or not target or not func or not func.isidentifier():
        raise PipelineError(f"pipeline {text!r} must be {FORMS}")
    looks_like_path = target.endswith(".py") or "/" in target or target.startswith(".")
    if not looks_like_path:
        if not all(part.isidentifier() for part in target.split(".")):
            raise PipelineError(f"pipeline module {target!r} is not a dotted module name; {FORMS}")
        return PipelineRef(text, target, func, None, None)
    path = Path(target).expanduser().resolve()
    if path.name == "__init__.py":
        path = path.parent
    if path.is_dir():
        if not (path / "__init__.py").is_file():
            raise PipelineError(
                f"pipeline directory {target} is not a package (no __init__.py); give the "
                f"file instead: {target.rstrip('/')}/FILE.py:{func}"
            )
    elif not path.is_file():
        raise PipelineError(f"pipeline file {target} does not exist (cwd: {Path.cwd()})")
    elif path.suffix != ".py":
        raise PipelineError(f"pipeline file {target} is not a .py file; {FORMS}")
    name, root = module_name_of(path)
    return PipelineRef(text, name, func, root, path)


def module_name_of(path: Path) -> tuple[str, Path]:
    """The dotted name of a .py file or package directory, and the directory above its top
    package (walking up while the parent directory has an ``__init__.py``)."""
    parts = [path.name if path.is_dir() else path.stem]
    parent = path.parent
    while (parent / "__init__.py").is_file() and parent.parent != parent:
        parts.insert(0, parent.name)
        parent = parent.parent
    name = ".".join(parts)
    if not all(p.isidentifier() for p in parts):
        raise PipelineError(
            f"pipeline file {path} would be imported as {name!r}, which is not a valid module "
            f"name; rename it (letters, digits and underscores)"
        )
    return name, parent


def load(text: str) -> LoadedPipeline:
    """Import the module, call the build function, check the graph."""
    ref = parse_reference(text)
    if ref.root is not None and str(ref.root) not in sys.path:
        sys.path.insert(0, str(ref.root))
    module = _import(ref)
    func = getattr(module, ref.function, None)
    if func is None or not callable(func):
        candidates = sorted(
            n
            for n, v in vars(module).items()
            if callable(v)
            and not n.startswith("_")
            and getattr(v, "__module__", None) == module.__name__
        )
        raise PipelineError(
            f"module '{ref.module}' has no function '{ref.function}'"
            + (f"; it has: {', '.join(candidates)}" if candidates else "")
        )
    try:
        pipeline = func()
    except Exception as exc:
        raise PipelineError(
            f"pipeline {ref.text}: {ref.function}() raised {_one_line(exc)}",
            detail=_user_traceback(exc),
        ) from exc
    if not isinstance(pipeline, PipelineGraph):
        raise PipelineError(f"{ref.text} returned {type(pipeline).__name__}, not a stator Pipeline")
    pipeline.validate()
    return LoadedPipeline(pipeline, ref, _import_root(module))


def load_pipeline(text: str) -> PipelineGraph:
    return load(text).pipeline


def _import(ref: PipelineRef) -> ModuleType:
    where = f" ({ref.file})" if ref.file else ""
    try:
        module = importlib.import_module(ref.module)
    except ModuleNotFoundError as exc:
        if exc.name and (ref.module == exc.name or ref.module.startswith(exc.name + ".")):
            raise PipelineError(
                f"cannot import pipeline module '{ref.module}': no module named "
                f"'{exc.name}' (is its directory on PYTHONPATH? cwd: {Path.cwd()}; or give "
                f"path/to/file.py:{ref.function})"
            ) from exc
        raise PipelineError(
            f"pipeline module '{ref.module}'{where} failed to import: {_one_line(exc)}",
            detail=_user_traceback(exc),
        ) from exc
    except Exception as exc:
        raise PipelineError(
            f"pipeline module '{ref.module}'{where} failed to import: {_one_line(exc)}",
            detail=_user_traceback(exc),
        ) from exc
    if ref.file is not None:
        expected = ref.file / "__init__.py" if ref.file.is_dir() else ref.file
        actual = Path(getattr(module, "__file__", None) or "").resolve()
        if actual != expected:
            raise PipelineError(
                f"pipeline file {ref.file} is imported as module '{ref.module}', but that name "
                f"is already taken by {getattr(module, '__file__', None) or 'a built-in module'}; "
                f"rename the file"
            )
    return module


def _import_root(module: ModuleType) -> str | None:
    """The sys.path entry ``module`` was found under; None when workers import it the same
    way anyway (a built-in or namespace module, or one installed in the interpreter's own
    site-packages or standard library)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    depth = module.__name__.count(".") + (1 if path.name == "__init__.py" else 0)
    root = path.parents[depth]
    if root in _interpreter_paths():
        return None
    return str(root)


def _interpreter_paths() -> set[Path]:
    paths = [*site.getsitepackages(), site.getusersitepackages()]
    paths += [sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    return {Path(p).resolve() for p in paths if p}


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the user's code down, without the loader's own frame."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
