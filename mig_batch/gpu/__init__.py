"""GPU backends: one interface over NVML (real GPUs) and an emulated, file-backed node."""
