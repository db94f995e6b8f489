"""The GPU catalog: MIG-capable models, their profiles and placements, from the researched facts
(pure data, no NVML); and a model built from what a GPU's own driver reports."""
