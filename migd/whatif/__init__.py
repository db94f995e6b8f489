"""The what-if: a cluster's job history replayed against the layouts a node may take (docs/demand.md)."""
