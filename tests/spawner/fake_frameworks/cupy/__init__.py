"""A fake of CuPy's default memory pool."""

calls: list[tuple[object, ...]] = []


class _Pool:
    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        calls.append(("set_limit", size))


_pool = _Pool()


def get_default_memory_pool() -> _Pool:
    return _pool
