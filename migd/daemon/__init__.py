"""The migd daemon: config, schedule, reconcile loop, control socket, systemd integration."""
