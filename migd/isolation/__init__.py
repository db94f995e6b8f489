"""Fault isolation: a static audit of the layout and a watch on NVML fault events."""
