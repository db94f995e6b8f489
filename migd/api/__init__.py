"""migd's wire types: what it writes for others to read (migctl, metrics, files), in one place,
like mig-parted's ``api/``.  Each schema is versioned; fields are only added within a version."""
