"""RocksDB options for keyed state, with the defaults Stator uses and why.

Every task opens its subtask's database, processes one epoch, commits it in one write batch
and closes it again (Spark may run the next epoch in another Python worker). That shapes the
defaults: no write-ahead log (an epoch is durable once flushed at the end of its task, and a
crash before that must lose the epoch anyway), a flush per epoch, and a compaction style that
keeps incremental checkpoints small.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

import rocksdict

CompactionStyle = Literal["level", "universal"]
Compression = Literal["none", "snappy", "lz4", "zstd"]


@dataclass(frozen=True)
class RocksDBOptions:
    # Memtable size. An epoch's writes go to one memtable and are flushed when the task ends,
    # so this also bounds the size of the L0 file an epoch produces before RocksDB splits it.
    write_buffer_size: int = 64 * 1024 * 1024
    max_write_buffer_number: int = 3
    # Block cache shared by every database a Python worker opens (it outlives the task).
    block_cache_bytes: int = 128 * 1024 * 1024
    # Bloom filter bits per key: point lookups skip files that cannot hold the key.
    bloom_bits_per_key: int = 10
    # Index and filter blocks split into partitions of about 4 KiB behind a small top-level
    # index pinned in the cache (Flink's setting with managed memory). An epoch's writes
    # are one batch, so a large epoch (a first load, a backfill) flushes into one large SST
    # whose monolithic index block (5 MB for 1 GB of 4 KiB values) is too big for a shard of
    # the block cache: it was read again at every seek and lookup, and a keyed task's timer
    # check over 64 key-groups took 0.49 s per epoch on 1 GB written at once (0.002 s
    # partitioned). Applies to SST files written from then on.
    partitioned_index: bool = True
    compression: Compression = "lz4"
    # "universal" rewrites far fewer bytes than "level" when updates are spread over all keys,
    # which keeps incremental checkpoints close to the bytes that actually changed.
    compaction_style: CompactionStyle = "universal"
    # Universal: merge runs of similar size only when this many are present (wider merges
    # mean each byte is rewritten fewer times), and full-compact when the newer runs together
    # exceed this percentage of the oldest run.
    universal_min_merge_width: int = 8
    universal_max_size_amplification_percent: int = 200
    level0_file_num_compaction_trigger: int = 8
    target_file_size_base: int = 64 * 1024 * 1024
    max_background_jobs: int = 2
    # Files kept open; -1 opens (and indexes) all of them when the task opens the database.
    max_open_files: int = 1024

    def __post_init__(self) -> None:
        for name in (
            "write_buffer_size",
            "block_cache_bytes",
            "target_file_size_base",
            "max_write_buffer_number",
            "max_background_jobs",
            "level0_file_num_compaction_trigger",
            "universal_min_merge_width",
            "universal_max_size_amplification_percent",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"state.rocksdb.{name} must be positive, got {getattr(self, name)}"
                )
        if self.bloom_bits_per_key < 0:
            raise ValueError("state.rocksdb.bloom_bits_per_key must be >= 0 (0: no bloom filter)")
        if self.max_open_files < -1 or self.max_open_files == 0:
            raise ValueError(
                "state.rocksdb.max_open_files must be -1 (keep every file open) or positive, "
                f"got {self.max_open_files}"
            )
        if self.compaction_style not in ("level", "universal"):
            raise ValueError(
                f"state.rocksdb.compaction_style must be 'level' or 'universal', "
                f"got {self.compaction_style!r}"
            )
        if self.compression not in ("none", "snappy", "lz4", "zstd"):
            raise ValueError(
                f"state.rocksdb.compression must be none, snappy, lz4 or zstd, "
                f"got {self.compression!r}"
            )

    def build(self) -> rocksdict.Options:
        """The rocksdict options, in raw-bytes mode (keys and values are bytes)."""
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(self.write_buffer_size)
        opts.set_max_write_buffer_number(self.max_write_buffer_number)
        opts.set_max_background_jobs(self.max_background_jobs)
        opts.set_max_open_files(self.max_open_files)
        opts.set_target_file_size_base(self.target_file_size_base)
        opts.set_level_zero_file_num_compaction_trigger(self.level0_file_num_compaction_trigger)
        opts.set_compression_type(_compression(self.compression))
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(_shared_cache(self.block_cache_bytes))
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_cache_index_and_filter_blocks(True)
        if self.partitioned_index:
            table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
            table.set_partition_filters(True)
            table.set_metadata_block_size(4096)
            table.set_pin_top_level_index_and_filter(True)
        opts.set_block_based_table_factory(table)
        if self.compaction_style == "universal":
            opts.set_compaction_style(rocksdict.DBCompactionStyle.universal())
            uni = rocksdict.UniversalCompactOptions()
            uni.min_merge_width = self.universal_min_merge_width
            uni.max_size_amplification_percent = self.universal_max_size_amplification_percent
            opts.set_universal_compaction_options(uni)
        else:
            opts.set_compaction_style(rocksdict.DBCompactionStyle.level())
        return opts


@cache
def _shared_cache(capacity: int) -> rocksdict.Cache:
    return rocksdict.Cache(capacity)


def _compression(name: Compression) -> rocksdict.DBCompressionType:
    kinds = {
        "none": rocksdict.DBCompressionType.none,
        "snappy": rocksdict.DBCompressionType.snappy,
        "lz4": rocksdict.DBCompressionType.lz4,
        "zstd": rocksdict.DBCompressionType.zstd,
    }
    return kinds[name]()
