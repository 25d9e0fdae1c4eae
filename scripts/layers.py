"""The package's layers and import rules, derived from the code (no import is executed).

    python scripts/layers.py            # check the rules: one line per violation, exit 1
    python scripts/layers.py --write    # regenerate the generated part of docs/architecture.md

Layers, from the bottom: ``common`` < ``data``, ``corpus`` < ``model`` < ``trainer`` <
commands. A module may import from its own layer and the layers below it, never above;
``data`` and ``corpus`` are siblings that do not import each other; a command (a module
users run, ``python -m atom_train.<command>``) is imported by nothing outside itself. Every
import counts, at module level or inside a function: a lazy import is still a dependency.
Only the commands that plan a trainer run (`PLANNING_COMMANDS`) import the run planner
(``trainer.plan``); the others take a device, a loop or a corpus from ``model.backend`` and
``data.sources``. The package root (``atom_train/__init__.py``: the lazy public API and ``__version__``) is
above every layer and imported by Python before any submodule, so importing it is allowed.

`TORCH_FREE` lists the modules that must load without torch (the supervisor, the kernel
report's torch-free side environment, the corpus builder, plotting on a laptop, the
command-line plumbing); tests/test_layers.py imports each in a fresh interpreter and checks.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "atom_train"

# Layer name -> rank (imports may only point to an equal or lower rank).
RANKS = {"common": 0, "data": 1, "corpus": 1, "model": 2, "trainer": 3, "commands": 4}
SIBLINGS = {frozenset({"data", "corpus"})}
# Subpackages that are a command as a whole (python -m atom_train.<name>), and the modules of
# a layer subpackage that are its command.
COMMAND_PACKAGES = {"bench", "preflight"}
# (`atomdata-rs verify`, the console command of the data layer, reads built corpora too.)
COMMAND_MODULES = {
    "atom_train.corpus.__main__": "corpus",
    "atom_train.corpus.command": "corpus",
    "atom_train.data.verify": "verify",
}

# The run planner (`resolve_run`: what a trainer command line means in its run folder) is
# imported by the commands that plan a trainer run, and by no other: a command that only
# needs a device, a field loop or a corpus takes them from the layers that own them
# (`model.backend`, `data.sources`), not from the planner.
PLANNER = f"{PACKAGE}.trainer.plan"
PLANNING_COMMANDS = frozenset({"train", "tune", "preflight"})

TORCH_FREE = (
    "atom_train",
    "atom_train.common.atomic",
    "atom_train.common.cli",
    "atom_train.common.figures",
    "atom_train.common.measure",
    "atom_train.common.metrics",
    "atom_train.data.atomizer",
    "atom_train.data.synthetic",
    "atom_train.data.text_checks",
    "atom_train.corpus.build",
    "atom_train.corpus.command",
    "atom_train.model.config",
    "atom_train.model.field_kernels",
    "atom_train.trainer.divergence",
    "atom_train.trainer.loss_log",
    "atom_train.trainer.lr_schedule",
    "atom_train.trainer.noise_scale",
    "atom_train.trainer.rundir",
    "atom_train.trainer.run_logs",
    "atom_train.trainer.tensorboard_log",
    "atom_train.trainer.text_sources",
    "atom_train.demo_corpus",
    "atom_train.kernel_report",
    "atom_train.plot",
    "atom_train.preflight.checks",
    "atom_train.preflight.crash_probe",
    "atom_train.supervise",
)
# The heaviest dependency each of these may not pull in either (the kernel report runs in a
# side environment that has Triton and numpy only; the supervisor has the standard library).
STDLIB_ONLY = (
    "atom_train.common.atomic",
    "atom_train.common.cli",
    "atom_train.supervise",
    "atom_train.preflight.crash_probe",  # (a launch costs a bare interpreter start)
    "atom_train.trainer.divergence",  # (the supervisor words a diverged run's stop with it)
)


@dataclass(frozen=True)
class Module:
    name: str  # dotted: atom_train.model.batched
    path: Path
    doc: str  # first line of the docstring
    imports: frozenset[str]  # dotted project modules it imports (anywhere in the file)
    external: frozenset[str]  # top-level names of everything else it imports


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def scan(root: Path = REPO) -> dict[str, Module]:
    """Every module of the package with the project modules it imports."""
    paths = sorted((root / PACKAGE).rglob("*.py"))
    names = {module_name(p, root) for p in paths} | {f"{PACKAGE}._atomdata"}
    out = {}
    for path in paths:
        name = module_name(path, root)
        tree = ast.parse(path.read_text(), str(path))
        deps, external = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == PACKAGE:
                        deps.add(_owner(a.name, names))
                    else:
                        external.add(a.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] != PACKAGE:
                    external.add(node.module.split(".")[0])
                    continue
                for a in node.names:  # `from atom_train.x import y`: y may be a module
                    sub = f"{node.module}.{a.name}"
                    deps.add(sub if sub in names else _owner(node.module, names))
            elif isinstance(node, ast.ImportFrom) and node.level:
                raise SystemExit(f"{path}: relative import; write it absolute")
        para = (ast.get_docstring(tree) or "").strip().split("\n\n")[0].replace("\n", " ")
        doc = para.split(". ")[0]  # its first sentence
        doc += "" if doc.endswith((".", "?", "!")) else "."
        out[name] = Module(name, path, doc, frozenset(deps - {name}), frozenset(external))
    return out


def _owner(dotted: str, names: set[str]) -> str:
    while dotted not in names and "." in dotted:
        dotted = dotted.rsplit(".", 1)[0]
    return dotted


def layer_of(name: str) -> str | None:
    """The layer of a module; None for the package root (above every layer)."""
    parts = name.split(".")
    if name == PACKAGE:
        return None
    if name in COMMAND_MODULES or parts[1] in COMMAND_PACKAGES:
        return "commands"
    if parts[1] == "_atomdata":
        return "data"
    if len(parts) == 2:
        return "commands"  # a module at the root is a command
    return parts[1]


def command_of(name: str) -> str | None:
    """Which command a module belongs to (a root module, a command package, a layer's command
    modules), or None."""
    if layer_of(name) != "commands":
        return None
    return COMMAND_MODULES.get(name) or name.split(".")[1]


def violations(modules: dict[str, Module]) -> list[str]:
    """Every import that breaks a rule, and every import cycle, one line each."""
    out = []
    for m in modules.values():
        src = layer_of(m.name)
        for dep in sorted(m.imports):
            dst = layer_of(dep)
            if dst is None or src is None:
                continue
            if RANKS[dst] > RANKS[src]:
                out.append(f"{m.name} ({src}) imports {dep} ({dst}): a layer above")
            elif frozenset({src, dst}) in SIBLINGS and src != dst:
                out.append(f"{m.name} ({src}) imports {dep} ({dst}): sibling layers")
            elif command_of(dep) and command_of(dep) != command_of(m.name):
                out.append(f"{m.name} imports {dep}: a command (move what both need down)")
            elif dep == PLANNER and command_of(m.name) not in (None, *PLANNING_COMMANDS):
                out.append(
                    f"{m.name} imports {dep}: the run planner, in a command that plans no "
                    "run (the device and loop: model.backend; corpora: data.sources)"
                )
    for m in modules.values():
        if m.name in STDLIB_ONLY:
            extra = sorted(
                e for e in m.external if e not in sys.stdlib_module_names and e != "__future__"
            )
            if extra:
                out.append(f"{m.name} must use the standard library only; imports {extra}")
    out += [" -> ".join(c) + ": an import cycle" for c in cycles(modules)]
    return out


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (none in a healthy package)."""
    # The package root is left out: its imports are the lazy API's (TYPE_CHECKING only), and
    # modules import it only for __version__.
    graph = {
        n: sorted(d for d in m.imports if d in modules and d != PACKAGE)
        for n, m in modules.items()
        if n != PACKAGE
    }
    found, done = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start and not done & set(path):
                    found.append([*path, start])
                    done |= set(path)
                elif nxt not in path and nxt not in done:
                    stack.append((nxt, [*path, nxt]))
    return found


# ---- the generated part of docs/architecture.md ------------------------------------------------

BEGIN = "<!-- generated by scripts/layers.py --write: do not edit by hand -->"
END = "<!-- end of generated part -->"


def allowed(layer: str) -> str:
    lower = [
        n
        for n, r in RANKS.items()
        if r < RANKS[layer] and n != "commands" and frozenset({n, layer}) not in SIBLINGS
    ]
    same = "itself" if layer != "commands" else "its own command's modules"
    return ", ".join([same, *lower])


def generated(modules: dict[str, Module]) -> str:
    def short(n: str) -> str:
        return n.removeprefix(f"{PACKAGE}.")

    rows = ["| layer | what | may import |", "|---|---|---|"]
    for layer in RANKS:
        if layer == "commands":
            what = "what users run: `python -m atom_train.<command>`"
        else:
            what = modules[f"{PACKAGE}.{layer}"].doc
        rows.append(f"| `{layer}` | {what} | {allowed(layer)} |")
    table = ["| module | layer | its job | imports from the project |", "|---|---|---|---|"]
    order = sorted(modules, key=lambda n: (RANKS.get(layer_of(n) or "", -1), n))
    for n in order:
        m = modules[n]
        if n.endswith("__init__") or (n != PACKAGE and m.path.name == "__init__.py"):
            continue
        deps = ", ".join(f"`{short(d)}`" for d in sorted(m.imports) if d != PACKAGE) or "-"
        table.append(f"| `{short(n) or PACKAGE}` | {layer_of(n) or 'api'} | {m.doc} | {deps} |")
    free = ", ".join(f"`{short(n) or PACKAGE}`" for n in TORCH_FREE)
    return "\n".join(
        [
            BEGIN,
            "",
            *rows,
            "",
            f"Modules that load without torch (checked in a fresh interpreter): {free}.",
            "",
            *table,
            "",
            END,
        ]
    )


def write_doc(path: Path, modules: dict[str, Module]) -> bool:
    """Replace the generated part of `path`; True if it changed."""
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + generated(modules) + tail
    if new != text:
        path.write_text(new)
    return new != text


def doc_is_current(path: Path, modules: dict[str, Module]) -> bool:
    text = path.read_text()
    return BEGIN in text and generated(modules) in text


def main(argv: list[str]) -> int:
    modules = scan()
    doc = REPO / "docs" / "architecture.md"
    if argv == ["--write"]:
        print(f"{doc}: {'updated' if write_doc(doc, modules) else 'already current'}")
        return 0
    if argv:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    bad = violations(modules)
    if not doc_is_current(doc, modules):
        bad.append(f"{doc}: the generated part is stale: run python scripts/layers.py --write")
    for line in bad:
        print(line)
    print(
        f"{len(modules)} modules, {sum(len(m.imports) for m in modules.values())} imports: "
        f"{len(bad)} violation(s)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
