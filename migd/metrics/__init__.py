"""Per-instance metrics: a sampler that owns NVML reads, a collector over its snapshots, HTTP."""
