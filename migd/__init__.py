"""migd: declarative, scheduled, transactional NVIDIA MIG partition management."""

__version__ = "0.1.0"
