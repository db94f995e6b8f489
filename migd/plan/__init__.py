"""Planning: from a desired layout and what a GPU holds to the fewest NVML operations.

``requests`` (what is asked: desired instances and layouts), ``firstfit`` (the driver's own placement
order), ``placement`` (the search over placements), ``planner`` (operations, busy instances, the
plan), ``offline`` (a catalog GPU to plan on without hardware).  It knows GPU models and NVML's
types, never profiles' files: ``migd.profiles`` resolves a file into requests and depends on this.
"""
