"""Who may use which MIG instance: the driver's nvidia-capabilities, set by owner (docs/users.md)."""
