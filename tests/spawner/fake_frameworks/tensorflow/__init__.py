"""A fake of tf.config's logical-device API, with its real signatures."""

calls: list[tuple[object, ...]] = []


class _Config:
    class LogicalDeviceConfiguration:
        def __init__(self, memory_limit: int | None = None) -> None:
            self.memory_limit = memory_limit

    @staticmethod
    def list_physical_devices(device_type: str | None = None) -> list[str]:
        return ["/physical_device:GPU:0"] if device_type == "GPU" else []

    @staticmethod
    def set_logical_device_configuration(device: str, logical_devices: list[object]) -> None:
        calls.append((device, [d.memory_limit for d in logical_devices]))  # type: ignore[attr-defined]


config = _Config()
