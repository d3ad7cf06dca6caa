"""One way to hold a resource: ``close()`` it at the end of a ``with`` block and when collected."""

from __future__ import annotations

from typing import Self


class Closing:
    """A resource released by ``close()`` (idempotent): at the end of a ``with`` block,
    and, should its owner forget, when the object is collected (quietly then: the
    interpreter may be shutting down)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection time
            pass
