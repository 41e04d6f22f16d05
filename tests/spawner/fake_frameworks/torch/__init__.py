"""A fake of the parts of torch.cuda the limits hook calls, with their real signatures."""

calls: list[tuple[object, ...]] = []


class _Props:
    total_memory = 16 * 2**30


class cuda:  # noqa: N801 - mirrors the module name
    _queued: list[object] = []  # noqa: RUF012 - shared, like the real module state
    _initialized = False

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_properties(device: int) -> _Props:
        return _Props()

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: int = 0) -> None:
        calls.append(("set_per_process_memory_fraction", round(fraction, 4), device))

    @staticmethod
    def is_initialized() -> bool:
        return cuda._initialized

    @staticmethod
    def _lazy_call(callable_: object) -> None:
        cuda._queued.append(callable_)

    @staticmethod
    def init() -> None:  # torch.cuda.init() runs the queued calls, as _lazy_init does
        cuda._initialized = True
        for queued in cuda._queued:
            queued()  # type: ignore[operator]
