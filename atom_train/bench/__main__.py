"""`python -m atom_train.bench`: see `atom_train.bench.command`."""

import sys

from atom_train.bench.command import main

if __name__ == "__main__":
    sys.exit(main())
