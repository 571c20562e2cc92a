"""A value computed on first use, once, by whichever thread asks first."""

from __future__ import annotations

import threading


class Lazy:
    """``get()`` computes the value on its first call and returns it on every call; an exception is
    raised to the caller and the next call tries again."""

    def __init__(self, fn):
        self._fn, self._done, self._value = fn, False, None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, value) -> "Lazy":
        done = cls(None)
        done._value, done._done = value, True
        return done

    @property
    def done(self) -> bool:
        return self._done

    def get(self):
        if not self._done:
            with self._lock:
                if not self._done:
                    self._value, self._done = self._fn(), True
                    self._fn = None
        return self._value
