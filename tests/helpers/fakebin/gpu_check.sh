#!/usr/bin/env bash
# Stand-in for scripts/gpu_check.sh: records that it ran, with which Python.
echo "gpu_check PYTHON=$PYTHON $*" >>"$FAKE_LOG"
echo "gpu_check: fake, nothing measured"
