"""PySpark's worker daemon, started without the archives Spark puts on its workers' path for
nothing.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, ``py4j-*-src.zip`` and the spark-core
jar first on the path of its Python workers. Where pyspark is a pip install (this project's
venv, the runtime image: ``SPARK_HOME`` is the installed package) the same modules are also
installed as files, and the jar holds no Python at all. Each archive costs every task: its
setup (``pyspark.worker_util.setup_spark_files``) calls ``importlib.invalidate_caches()``,
which makes Python 3.11's zip importer re-read the archive's whole directory (the jar has
5,000 entries, the pyspark zip 3 MB): a tenth of the Python workers' CPU in the keyed-count
benchmark (py-spy). And modules imported from a zip are compiled from source in every new
worker (a zip has no cached bytecode), which a replacement executor's first tasks wait for.

Spark starts this module as its daemon (``spark.python.daemon.module``, set by
``session.py``). It drops each jar without Python modules and each pyspark or py4j zip whose
package is installed elsewhere on the path at the same version, then runs PySpark's own
daemon; the workers it forks inherit the path. A zip that is the only copy, or a different
version, stays.

It also wraps each worker's per-task entry so it reads its task acknowledging at once
(``cluster/quick_ack.py``: a delayed acknowledgement held every task's input 40 ms) and so
a collector a Stator task paused (``tasks/gc_pause.py``) resumes only once PySpark has
sent that task's output. It starts the executor's checkpoint uploader
(``checkpoint/executor_uploader.py``) and loads what every worker would import in its first
task before it forks any (``tasks/worker_warmup.py``).
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from importlib.machinery import PathFinder

# (zip file name pattern, package whose version file decides, version file in the package)
_ZIPPED = (
    (re.compile(r"pyspark\.zip"), "pyspark", "version.py"),
    (re.compile(r"py4j-[\w.]+-src\.zip"), "py4j", "version.py"),
)


def _version_in_zip(archive: str, package: str, name: str) -> str | None:
    try:
        with zipfile.ZipFile(archive) as zf:
            return zf.read(f"{package}/{name}").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _version_installed(path: list[str], package: str, name: str) -> str | None:
    spec = PathFinder.find_spec(package, path)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        try:
            with open(os.path.join(location, name), encoding="utf-8") as f:
                return f.read()
        except OSError:
            continue
    return None


def _holds_python(archive: str) -> bool:
    try:
        with zipfile.ZipFile(archive) as zf:
            return any(n.endswith((".py", ".pyc")) for n in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return True  # cannot tell: keep it


def redundant_archives(path: list[str]) -> list[str]:
    """The entries of ``path`` that no import needs: jars without Python modules, and zipped
    copies of pyspark or py4j installed elsewhere on ``path`` with an identical version."""
    redundant = []
    for entry in path:
        if entry.endswith(".jar") and os.path.isfile(entry) and not _holds_python(entry):
            redundant.append(entry)
            continue
        base = os.path.basename(entry)
        for pattern, package, name in _ZIPPED:
            if not pattern.fullmatch(base):
                continue
            rest = [p for p in path if p != entry and not p.endswith((".zip", ".jar"))]
            zipped = _version_in_zip(entry, package, name)
            if zipped is not None and zipped == _version_installed(rest, package, name):
                redundant.append(entry)
    return redundant


def main() -> None:
    dropped = redundant_archives(sys.path)
    sys.path[:] = [p for p in sys.path if p not in dropped]
    for cached in list(sys.path_importer_cache):  # an archive's subdirectories too
        if any(cached == d or cached.startswith(d + os.sep) for d in dropped):
            del sys.path_importer_cache[cached]
    from pyspark import daemon  # noqa: PLC0415 - only after the path is trimmed

    from ..checkpoint import executor_uploader  # noqa: PLC0415 - after the trim too
    from ..cluster.quick_ack import acknowledging  # noqa: PLC0415 - after the trim too
    from .gc_pause import resume_after_each_task  # noqa: PLC0415 - after the trim too
    from .worker_warmup import warm  # noqa: PLC0415 - after the trim too

    executor_uploader.start()  # before any worker is forked: they inherit its address
    warm()  # before any worker is forked: they inherit what it loaded
    daemon.worker_main = resume_after_each_task(acknowledging(daemon.worker_main))
    daemon.manager()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
