"""migd.yaml as migd reads it: the configuration and its schedule, loaded once and read by the daemon and
by migctl's what-if alike."""
