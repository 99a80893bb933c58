"""A Linux timerfd: a descriptor that becomes readable at a point in time.

The event loop's own timers (uvloop's, libuv's) count whole milliseconds, too coarse
for the read window of :mod:`._channel`, which is a fraction of one.  A timerfd in the
channel poller's epoll set wakes the loop to the microsecond.  Python gains
``os.timerfd_create`` only in 3.13; this is the same two system calls through ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

__all__ = ["TimerFd"]

_CLOCK_MONOTONIC = 1  # the clock of time.monotonic()
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_timerfd_create = _libc.timerfd_create
_timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
_timerfd_create.restype = ctypes.c_int
_timerfd_settime = _libc.timerfd_settime
_timerfd_settime.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(_Itimerspec),
    ctypes.POINTER(_Itimerspec),
]
_timerfd_settime.restype = ctypes.c_int


def _check(result: int) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


class TimerFd:
    """A one-shot timer on CLOCK_MONOTONIC; read it (:meth:`clear`) once it fired."""

    def __init__(self) -> None:
        self.fd = _check(_timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
        self._spec = _Itimerspec()

    def fire_at(self, deadline: float) -> None:
        """Become readable at ``deadline`` (a :func:`time.monotonic` value)."""
        seconds = int(deadline)
        value = self._spec.it_value
        value.tv_sec = seconds
        value.tv_nsec = int((deadline - seconds) * 1e9)
        _check(_timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None))

    def clear(self) -> None:
        """Take the expiration, so the descriptor is no longer readable."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)
