#!/bin/sh
# How many projects start training: a wrapper sets up the environment, then runs Python.
set -e
here=$(dirname "$0")
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$here"
python -m shape_pkg.train "$@"
echo "shape_run.sh: training finished"
