"""Layouts that follow demand: what Slurm's queue asks for, decided by an explainable rule (docs/demand.md)."""
