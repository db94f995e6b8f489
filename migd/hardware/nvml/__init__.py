"""The one NVML adapter: ``backend.NvmlBackend`` over pynvml (``call``: errors and the shared session;
``view``: the sampler's cached view; ``telemetry``: events and GPM; ``profiletables``: the live tables)."""
