#!/usr/bin/env bash
# Train under the supervisor: relaunch after a crash, stop cleanly on SIGTERM / Ctrl-C.
#
# Usage:
#   scripts/train.sh [supervisor options] -- <train args>
#
#   scripts/train.sh -- --corpus data/fr -B 512 --device cuda --output-dir runs/fr1
#   scripts/train.sh --on-complete 'sudo poweroff' -- --corpus data/fr --output-dir runs/fr1
#
# Detached, surviving the end of an SSH session (trainer output goes to train.out):
#   mkdir -p runs/fr1 && nohup scripts/train.sh -- --corpus data/fr --device cuda \
#       --output-dir runs/fr1 > runs/fr1/train.out 2>&1 &
#   tail -f runs/fr1/supervisor.log runs/fr1/train.out
#   kill -USR1 "$(cat runs/fr1/supervisor.pid)"   # checkpoint now, keep training
#   kill -TERM "$(cat runs/fr1/supervisor.pid)"   # checkpoint and stop (no relaunch)
#
# Supervisor options (python -m atom_train.supervise --help): --backoff SECONDS (10),
# --max-backoff SECONDS (300), --max-failures N (5), --on-complete CMD, --module NAME.
# Runbook: docs/supervisor.md.
#
# Environment:
#   ATOM_PYTHON   interpreter to use (default: the repository's .venv/bin/python)
# Paths in the train args are relative to the current directory, not to the repository.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${ATOM_PYTHON:-$root/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
    echo "train.sh: no Python at $python: run \`make setup\` in $root, or set ATOM_PYTHON" >&2
    exit 2
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
# exec: signals sent to this script's pid reach the supervisor itself.
exec "$python" -m atom_train.supervise "$@"
