"""Applying plans: the lock, the journal, hooks and the transactional executor."""
