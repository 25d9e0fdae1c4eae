"""A run's one typed form: `RunConfig`, frozen sections built from the flag table.

Every flag of `trainer.flags.FLAGS` names its section (`Flag.section`); the sections here are
generated from that table, so a flag lands in exactly one section field and every field is a
flag (held by a test). The model section is `ModelConfig` itself (its command-line fields;
the fields that are not flags keep their defaults). The lifecycle flags (``--output-dir``,
``--fork``, ``--init``, ``--keep-optimizer``, ``--revert-ok``) are the separate `Lifecycle`
value: how a command relates to runs, never compared.

- `to_dict` / `from_dict`: JSON-safe, with ``format`` (`FORMAT`); a checkpoint's
  ``meta["config"]``.
- `from_args`: the one reader of a flat ``dest -> value`` mapping (a parsed command line,
  or the ``args`` of a checkpoint written before ``meta["config"]``).
- `to_argv`: the command line that reproduces the config (argv -> config -> argv is stable).
- `replace(**changes)`: by dotted name (``"optimizer.lr"``), by flag dest (``lr``) or by
  section (``optimizer=OptimizerConfig(...)``).
- `of_class(cls)` and `model()`/`run()`/`policy()`/`free()`: the flags of one resume class,
  as ``dest -> value`` (what resume, pivot and fork compare).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from atom_train.common.cli import UserError
from atom_train.model.config import ModelConfig
from atom_train.trainer import flags as F

FORMAT = 1  # of to_dict's form; from_dict refuses another

RUN_SECTIONS = tuple(s for s in F.SECTIONS if s not in ("model", "lifecycle"))


def _section_flags(section: str) -> tuple[F.Flag, ...]:
    return tuple(f for f in F.FLAGS if f.section == section)


def _default(f: F.Flag) -> Any:
    if f.kwargs.get("action") == "store_true":
        return False
    return f.default


def _make_section(section: str) -> type:
    fields = [
        (f.dest, Any, dataclasses.field(default=_default(f))) for f in _section_flags(section)
    ]
    name = section.capitalize() + "Config"
    return dataclasses.make_dataclass(name, fields, frozen=True)


DataConfig = _make_section("data")
ScheduleConfig = _make_section("schedule")
OptimizerConfig = _make_section("optimizer")
PeriodsConfig = _make_section("periods")
ValidationConfig = _make_section("validation")
LoggingConfig = _make_section("logging")
HardwareConfig = _make_section("hardware")
GuardConfig = _make_section("guard")
Lifecycle = _make_section("lifecycle")

SECTION_TYPES: dict[str, type] = {
    "data": DataConfig,
    "schedule": ScheduleConfig,
    "optimizer": OptimizerConfig,
    "periods": PeriodsConfig,
    "validation": ValidationConfig,
    "logging": LoggingConfig,
    "hardware": HardwareConfig,
    "guard": GuardConfig,
    "model": ModelConfig,
}
if set(SECTION_TYPES) | {"lifecycle"} != set(F.SECTIONS):
    raise AssertionError("RunConfig's sections and flags.SECTIONS differ")


def _json(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


@dataclasses.dataclass(frozen=True)
class RunConfig:
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    periods: PeriodsConfig = dataclasses.field(default_factory=PeriodsConfig)
    validation: ValidationConfig = dataclasses.field(default_factory=ValidationConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig)
    guard: GuardConfig = dataclasses.field(default_factory=GuardConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)

    # ---- flat access --------------------------------------------------------------------

    def value(self, dest: str) -> Any:
        """The value of one flag, by its dest (``lr``, ``B``, ``n_modes``)."""
        f = _run_flag(dest)
        return getattr(getattr(self, f.section), dest)

    def flat(self) -> dict[str, Any]:
        """Every flag's value, ``dest -> value``, in table order (lifecycle flags excepted)."""
        return {f.dest: self.value(f.dest) for f in F.FLAGS if f.section != "lifecycle"}

    def of_class(self, cls: str) -> dict[str, Any]:
        """The flags of one resume class (flags.CLASSES), ``dest -> value``."""
        if cls == "lifecycle":
            raise ValueError("lifecycle flags are the Lifecycle value, not the RunConfig's")
        return {d: self.value(d) for d in F.dests(cls)}

    def model_flags(self) -> dict[str, Any]:
        return self.of_class("model")

    def run(self) -> dict[str, Any]:
        return self.of_class("run")

    def policy(self) -> dict[str, Any]:
        return self.of_class("policy")

    def free(self) -> dict[str, Any]:
        return self.of_class("free")

    # ---- changes ------------------------------------------------------------------------

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with `changes`: ``section=<section value>``, ``lr=...`` (a flag dest) or,
        through ``**{"optimizer.lr": ...}``, a dotted name."""
        per: dict[str, dict[str, Any]] = {}
        whole: dict[str, Any] = {}
        for key, v in changes.items():
            if "." in key:
                section, dest = key.split(".", 1)
                if section not in SECTION_TYPES or dest not in _fields(section):
                    raise ValueError(f"RunConfig has no field {key!r}")
                per.setdefault(section, {})[dest] = v
            elif key in SECTION_TYPES and (
                isinstance(v, SECTION_TYPES[key]) or key not in F.BY_DEST
            ):  # (``data`` is a section and a flag: a DataConfig is the section, else the flag)
                if not isinstance(v, SECTION_TYPES[key]):
                    raise TypeError(f"{key} must be a {SECTION_TYPES[key].__name__}")
                whole[key] = v
            else:
                per.setdefault(_run_flag(key).section, {})[key] = v
        out = dataclasses.replace(self, **whole)
        for section, vals in per.items():
            out = dataclasses.replace(
                out, **{section: dataclasses.replace(getattr(out, section), **vals)}
            )
        return out

    # ---- forms --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: ``{"format": FORMAT, section: {field: value}}`` (the model section
        holds every ModelConfig field, flags or not)."""
        out: dict[str, Any] = {"format": FORMAT}
        for section in SECTION_TYPES:
            obj = getattr(self, section)
            out[section] = {k: _json(v) for k, v in dataclasses.asdict(obj).items()}
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunConfig:
        if d.get("format") != FORMAT:
            raise UserError(
                f"run config format {d.get('format')!r} is not {FORMAT}: written by another "
                "version of atom_train (use that version)"
            )
        parts = {}
        for section, typ in SECTION_TYPES.items():
            vals = dict(d.get(section, {}))
            unknown = set(vals) - _fields(section)
            if unknown:
                raise UserError(f"run config section {section!r}: unknown {sorted(unknown)}")
            if section == "data" and vals.get("data") is not None:
                vals["data"] = list(vals["data"])
            parts[section] = typ(**vals)
        return cls(**parts)

    @classmethod
    def from_args(cls, args: Mapping[str, Any] | argparse.Namespace) -> RunConfig:
        """The one reader of a flat ``dest -> value`` mapping: a parsed command line, or
        the ``args`` of a checkpoint written before ``meta["config"]`` (a flag it lacks takes
        its default; a model flag left None takes ModelConfig's default; a key no flag
        declares, lifecycle ones included, is dropped)."""
        if isinstance(args, argparse.Namespace):
            args = vars(args)
        per: dict[str, dict[str, Any]] = {s: {} for s in SECTION_TYPES}
        for f in F.FLAGS:
            if f.section == "lifecycle" or f.dest not in args:
                continue
            v = args[f.dest]
            if f.section == "model" and v is None:
                continue
            per[f.section][f.dest] = v
        return cls(**{s: SECTION_TYPES[s](**per[s]) for s in SECTION_TYPES})

    def to_argv(self, every: bool = False) -> list[str]:
        """The trainer command line (without lifecycle flags) that parses back to this
        config: every flag whose value differs from its default (`every`: every flag that
        has a value, defaults too: a command that does not depend on them)."""
        argv: list[str] = []
        model_defaults = ModelConfig()
        for f in F.FLAGS:
            if f.section == "lifecycle":
                continue
            v = self.value(f.dest)
            if every:
                if v is not None:
                    argv += _flag_argv(f, v)
                continue
            if f.section == "model":
                if v == getattr(model_defaults, f.dest):
                    continue
            elif v == _default(f):
                continue
            argv += _flag_argv(f, v)
        return argv


def lifecycle_from_args(args: Mapping[str, Any] | argparse.Namespace) -> Lifecycle:
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    return Lifecycle(
        **{f.dest: args[f.dest] for f in _section_flags("lifecycle") if f.dest in args}
    )


def lifecycle_argv(lifecycle: Lifecycle) -> list[str]:
    """The command line of a `Lifecycle` (``--output-dir``, ``--fork``, ...): each flag set."""
    argv: list[str] = []
    for f in _section_flags("lifecycle"):
        v = getattr(lifecycle, f.dest)
        if v is not None and v is not False:
            argv += _flag_argv(f, str(v) if not isinstance(v, bool) else v)
    return argv


def _flag_argv(f: F.Flag, v: Any) -> list[str]:
    name, action = f.names[0], f.kwargs.get("action")
    if action == "store_true":
        return [name] if v else []
    if action is argparse.BooleanOptionalAction:
        return [name if v else "--no-" + name[2:]]
    if action == "append":
        return [x for item in (v or []) for x in (name, str(item))]
    if v is None:
        raise ValueError(f"{name}: None differs from its default and has no command line")
    if f.kwargs.get("nargs") == "?" and v == f.kwargs.get("const"):
        return [name]
    return [name, str(v)]


def _fields(section: str) -> set[str]:
    return {x.name for x in dataclasses.fields(SECTION_TYPES[section])}


def _run_flag(dest: str) -> F.Flag:
    f = F.BY_DEST.get(dest)
    if f is None or f.section == "lifecycle":
        raise ValueError(f"RunConfig has no flag {dest!r}")
    return f


def parse(
    argv: list[str], parser: argparse.ArgumentParser | None = None
) -> tuple[RunConfig, Lifecycle, frozenset[str]]:
    """The trainer's command line as (config, lifecycle, the dests it gives); the values are
    checked when the run is planned (`plan.resolve_run`), after its folder is locked. `parser`: the command's own (its --help text), by default the flag
    table's (`flags.build_parser`)."""
    args = (parser or F.build_parser()).parse_args(argv)
    return RunConfig.from_args(args), lifecycle_from_args(args), F.given_flags(argv)
