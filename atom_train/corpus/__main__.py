"""`python -m atom_train.corpus`: see `atom_train.corpus.command`."""

import sys

from atom_train.corpus.command import main

if __name__ == "__main__":
    sys.exit(main())
