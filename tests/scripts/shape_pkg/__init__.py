"""A training package run as ``python -m shape_pkg.train`` (by hand or from ``shape_run.sh``)."""
