"""What the running daemon keeps, live and on disk: its state (``status``) and a manual apply's hold
(``override``).  Below the daemon, migctl and the metrics, which read it; above the documents of
``migd.api`` it is written as."""
