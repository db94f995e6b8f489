"""GPU access: the catalog, the backend interface and its NVML implementation."""
