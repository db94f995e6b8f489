"""Profile files: loading (migd and mig-parted formats), resolution per GPU model, validation, export."""
