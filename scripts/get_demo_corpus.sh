#!/usr/bin/env bash
# Build the French demo corpus (data/demo) from Debian documentation packages.
# A thin wrapper: the logic and every flag live in atom_train/demo_corpus.py (--help).
#   scripts/get_demo_corpus.sh                      # data/demo, reused when complete
#   scripts/get_demo_corpus.sh --max-mib 8 --force  # a smaller corpus, rebuilt
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
if [[ ! -x "$py" ]]; then
    echo "error: $py not found: run 'make setup' in $root first" >&2
    exit 2
fi
cd "$root"
exec "$py" -m atom_train.demo_corpus "$@"
