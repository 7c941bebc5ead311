"""A keyed task's input: the :class:`~stator.longrun.messages.Data` frames upstream tasks
send it, gathered per epoch by one reader thread per connection, until the epoch has a frame
from every producer (the barrier: what a Spark shuffle's stage boundary was)."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from .messages import Data
from .wire import Channel, ChannelClosed, accept

ACCEPT_TIMEOUT_S = 10.0


class Aborted(RuntimeError):
    """The run ended while this task waited for its input."""


class Inbox:
    def __init__(self, server: socket.socket, token: bytes) -> None:
        self.server, self.token = server, token
        self._frames: dict[int, list[Data]] = {}
        self._cond = threading.Condition()
        self._aborted: str | None = None
        self._channels: list[Channel] = []
        threading.Thread(target=self._accept, name="stator-inbox-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                channel = accept(self.server, self.token, ACCEPT_TIMEOUT_S)
            except OSError:  # closed: the task ends
                return
            if channel is None:
                continue
            self._channels.append(channel)
            threading.Thread(
                target=self._read, args=(channel,), name="stator-inbox", daemon=True
            ).start()

    def _read(self, channel: Channel) -> None:
        while True:
            try:
                frame: Any = channel.recv()
            except (ChannelClosed, OSError):
                return  # the producer's run ended; a lost one fails the run on the driver
            if not isinstance(frame, Data):
                continue
            with self._cond:
                self._frames.setdefault(frame.epoch, []).append(frame)
                self._cond.notify_all()

    def take(self, epoch: int, expected: int) -> list[tuple[int, bytes]]:
        """Wait for ``expected`` frames of ``epoch``; their items, in no particular order
        (the keyed task sorts its input by order key)."""
        with self._cond:
            while len(self._frames.get(epoch, ())) < expected:
                if self._aborted is not None:
                    raise Aborted(self._aborted)
                self._cond.wait()
            frames = self._frames.pop(epoch, [])
            for old in [e for e in self._frames if e < epoch]:  # a rewound epoch's leftovers
                del self._frames[old]
        return [item for frame in frames for item in frame.items]

    def abort(self, why: str) -> None:
        with self._cond:
            self._aborted = why
            self._cond.notify_all()

    def close(self) -> None:
        self.abort("closed")
        with contextlib.suppress(OSError):
            self.server.close()
        for channel in self._channels:
            channel.close()
