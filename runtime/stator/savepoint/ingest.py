"""Restored state written as SST files and ingested into a fresh database.

A restore writes a whole subtask's state at once. Through the memtable that costs a copy into
the memtable, a flush that rewrites it, and compactions of the flushed files; SST files built
in key order and ingested skip all three. Entries arrive in key-group order (savepoint files
and old subtasks' ranges are read in order); within a key-group they are sorted here, since
state ids may be renumbered. A key-group that arrives out of order starts a new file, ingested
on its own, so any order is still correct.

The files are written with the database's compression unless the first rows do not compress
(a 64 KiB sample saves less than 1/8, RocksDB's own rule for keeping a block raw): RocksDB
would then spend the CPU compressing every block and store it raw anyway (lz4 on random values
is a third of the write time). Compactions later use the database's compression as always.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from itertools import chain
from pathlib import Path

import rocksdict

from ..state.options import RocksDBOptions
from .format import COMPRESSION_SAMPLE, compresses, leading_bytes


class SstIngest:
    def __init__(self, db: rocksdict.Rdict, options: RocksDBOptions, workdir: Path) -> None:
        self.db, self.options, self.workdir = db, options, workdir
        self.compression = ""  # the files' compression, chosen from the first rows
        self._writer_options: rocksdict.Options | None = None
        self.files: list[Path] = []
        self.writer: rocksdict.SstFileWriter | None = None
        self.writing = workdir / "00000.sst"  # the file ``writer`` writes
        self.rows: list[tuple[bytes, bytes]] = []
        self.kg = -1
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)

    def add(self, kg: int, rows: list[tuple[bytes, bytes]]) -> None:
        """Rows (key, value) of key-group ``kg``, in any order."""
        if kg != self.kg:
            self._write_rows()
            if kg < self.kg:
                self._finish_file()
            self.kg = kg
        self.rows += rows

    def finish(self) -> None:
        """Ingest what was added (moving the files into the database) and clean up."""
        try:
            self._finish_file()
            opts = rocksdict.IngestExternalFileOptions()
            opts.set_move_files(True)
            for path in self.files:  # one call per file: files may overlap
                self.db.ingest_external_file([str(path)], opts)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def discard(self) -> None:
        """Drop what was staged (a restore that failed part-way)."""
        self.rows = []
        self.writer = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _write_rows(self) -> None:
        if not self.rows:
            return
        self.rows.sort()
        if self.writer is None:
            self.writing = self.workdir / f"{len(self.files):05d}.sst"
            self.writer = rocksdict.SstFileWriter(options=self._options_for(self.rows))
            self.writer.open(str(self.writing))
        writer = self.writer
        for key, value in self.rows:
            writer[key] = value
        self.rows = []

    def _options_for(self, rows: list[tuple[bytes, bytes]]) -> rocksdict.Options:
        if self._writer_options is None:
            options, sample = (
                self.options,
                leading_bytes(chain.from_iterable(rows), COMPRESSION_SAMPLE),
            )
            # A small first key-group says little, and then the restore is cheap anyway.
            if len(sample) == COMPRESSION_SAMPLE and not compresses(sample):
                options = replace(options, compression="none")
            self.compression = options.compression
            self._writer_options = options.build()
        return self._writer_options

    def _finish_file(self) -> None:
        self._write_rows()
        if self.writer is not None:
            self.writer.finish()
            self.files.append(self.writing)
            self.writer = None
