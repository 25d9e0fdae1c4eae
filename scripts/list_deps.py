"""Print the project's Python dependencies (runtime + dev) from pyproject.toml, one per line.

`make setup` installs these into .venv; pyproject.toml stays the single list. Needs Python >= 3.11
(tomllib), as pyproject.toml's requires-python says.
"""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
deps = list(project["dependencies"])
for extra in sys.argv[2:]:
    deps += project["optional-dependencies"][extra]
print("\n".join(deps))
