"""The package's error bases, in a module that imports nothing of the package: the
extension (`_native`) builds its ring errors on `RingFailure` while it is being imported,
before `_errors` (which imports the extension) could be."""


class RingleaderError(Exception):
    """Base of the package's errors."""


class RingFailure(RingleaderError, RuntimeError):
    """Base of the ring's errors (`_native.RingError` and its subclasses): a `RuntimeError`
    as well, as they always were."""
