"""The GPU backend: one interface over NVML (``nvml``); ``nvml_emu``: an emulated libnvidia-ml for tests."""
