"""Print the project's Python dependencies (runtime + dev) from pyproject.toml, one per line.

`make setup` installs these into .venv; pyproject.toml stays the single list.
"""

import sys
from pathlib import Path

import tomllib

project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
deps = list(project["dependencies"])
for extra in sys.argv[2:]:
    deps += project["optional-dependencies"][extra]
print("\n".join(deps))
