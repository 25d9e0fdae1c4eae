"""`python -m atom_train.preflight`: see `atom_train.preflight.command`."""

import sys

from atom_train.preflight.command import main

if __name__ == "__main__":
    sys.exit(main())
