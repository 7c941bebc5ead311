"""The storage probe (``ObjectStore.check``) of two drivers of one job that start together
(an upgrade's pre-started driver beside the running one) on one ``file://`` root: neither
removes a directory the other is writing its probe in, and no probe is left behind."""

from __future__ import annotations

import threading
from pathlib import Path

from stator.storage import open_store


def test_concurrent_probes_of_one_fresh_root_do_not_trip_each_other(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    root = tmp_path / "a" / "ck" / "job"

    def probe() -> None:
        store = open_store(f"file://{root}")
        try:
            for _ in range(300):
                store.check()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=probe) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "no probe left behind"
