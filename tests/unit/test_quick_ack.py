"""Reads from the JVM acknowledge at once (``cluster/quick_ack.py``): the bytes are the same,
every read of a TCP socket asks for an immediate acknowledgement first, and anything that is
not a TCP socket is left alone."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from stator.cluster import quick_ack


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected loopback TCP pair, as the JVM and a Python worker are."""
    listener = socket.create_server(("127.0.0.1", 0))
    writer = socket.create_connection(listener.getsockname())
    reader, _ = listener.accept()
    listener.close()
    yield writer, reader
    writer.close()
    reader.close()


@pytest.fixture
def acks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors each acknowledgement request went to."""
    calls: list[int] = []
    real = quick_ack._ack_at_once

    def counting(sock: socket.socket) -> bool:
        calls.append(sock.fileno())
        return real(sock)

    monkeypatch.setattr(quick_ack, "_ack_at_once", counting)
    return calls


def _write_in_small_pieces(sock: socket.socket, pieces: list[bytes]) -> threading.Thread:
    """Small writes one after another, as the JVM sends data and then its end marker."""

    def send() -> None:
        for piece in pieces:
            sock.sendall(piece)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_a_worker_reads_the_same_bytes_asking_for_an_ack_before_every_read(
    tcp_pair: tuple[socket.socket, socket.socket], acks: list[int]
) -> None:
    writer, reader = tcp_pair
    infile = os.fdopen(os.dup(reader.fileno()), "rb", 65536)
    quick = quick_ack.quick_reader(infile, 65536)
    assert quick is not infile
    pieces = [b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff", b"\xff\xff\xff\xfc"]
    sender = _write_in_small_pieces(writer, pieces)
    got = b""
    while len(got) < sum(map(len, pieces)):
        got += quick.read1(65536)
    sender.join()
    assert got == b"".join(pieces)
    assert len(acks) >= 1  # one request per read of the descriptor
    quick.close()
    assert not infile.closed  # the worker's own file stays usable
    writer.sendall(b"more")
    assert infile.read(4) == b"more"
    infile.close()


def test_what_is_not_a_tcp_socket_is_read_as_before(acks: list[int]) -> None:
    left, right = socket.socketpair()  # a Unix socket: no Nagle, no delayed ack
    infile = os.fdopen(os.dup(right.fileno()), "rb", 65536)
    assert quick_ack.quick_reader(infile, 65536) is infile
    r, w = os.pipe()
    pipe = os.fdopen(r, "rb", 65536)
    assert quick_ack.quick_reader(pipe, 65536) is pipe
    assert acks == []
    for closing in (infile, pipe, left, right):
        closing.close()
    os.close(w)


def test_the_worker_entry_gets_the_quick_reader_and_it_is_closed_after_the_task(
    tcp_pair: tuple[socket.socket, socket.socket],
) -> None:
    writer, reader = tcp_pair
    seen: list[Any] = []

    def worker_main(infile: Any, outfile: Any) -> int:
        seen.append(infile)
        return len(infile.read(3))

    infile = os.fdopen(os.dup(reader.fileno()), "rb", 65536)
    writer.sendall(b"abc")
    assert quick_ack.acknowledging(worker_main)(infile, None) == 3
    assert seen[0] is not infile and seen[0].closed
    assert not infile.closed
    infile.close()


def test_the_driver_socket_files_ask_for_an_ack_and_install_is_idempotent(
    tcp_pair: tuple[socket.socket, socket.socket], acks: list[int]
) -> None:
    writer, reader = tcp_pair
    quick_ack.install()
    wrapped = socket.SocketIO.readinto
    quick_ack.install()
    assert socket.SocketIO.readinto is wrapped  # not wrapped twice
    sockfile = reader.makefile("rb")
    writer.sendall(b"py4j answer\n")
    assert sockfile.readline() == b"py4j answer\n"
    assert reader.fileno() in acks
    sockfile.close()
