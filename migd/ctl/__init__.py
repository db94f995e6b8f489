"""migctl: its command line (``main``, ``parser``), what migd answers on its behalf (``remote``), and
what it prints (``tables``, ``daemon_table``, ``status``, ``isolation``, ``apply``)."""
