"""What the data layer raises when a backend does not answer, and how it says why."""


class SourceUnavailableError(RuntimeError):
    """The hub or the Kubernetes API, which every page needs, did not answer; the page says so."""


def why(exc: Exception) -> str:
    """A failed request in a word or two: a hung server reads "timed out", not ConnectionError."""
    return "timed out" if "timed out" in str(exc).lower() else type(exc).__name__
