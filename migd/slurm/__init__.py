"""Slurm mode: change a node's MIG layout without killing a job, and tell Slurm the new GRES."""
