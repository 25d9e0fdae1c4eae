"""The public loader API: stubs that match the native module, and the bench script runs."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import atom_train
from atom_train import _atomdata
from atom_train.bench import command as bench
from atom_train.data import loader as data

STUB = Path(atom_train.__file__).with_name("_atomdata.pyi")


def stub_functions() -> dict[str, ast.FunctionDef]:
    """`name` or `Class.name` -> its def in the .pyi."""
    tree = ast.parse(STUB.read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
    return found


def stub_parameters(fn: ast.FunctionDef) -> list[tuple[str, object]]:
    args = [a.arg for a in fn.args.args if a.arg != "self"]
    defaults = [ast.literal_eval(d) for d in fn.args.defaults]
    padded = [inspect.Parameter.empty] * (len(args) - len(defaults)) + defaults
    return list(zip(args, padded, strict=True))


def runtime_parameters(obj) -> list[tuple[str, object]]:
    params = inspect.signature(obj).parameters.values()
    return [(p.name, p.default) for p in params if p.name != "self"]


def test_stubs_match_the_native_signatures():
    """The .pyi holds the module as it is: every public function and method of the native
    module has a stub with its parameters and defaults, every stub names something the
    module has, and so do the stub's classes and constants."""
    stubs = stub_functions()
    checked = {}
    for name in dir(_atomdata):
        obj = getattr(_atomdata, name)
        if name.startswith("_") or not callable(obj):
            continue
        if isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        if isinstance(obj, type):
            checked[f"{name}.__init__"] = obj
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    checked[f"{name}.{attr}"] = getattr(obj, attr)
        else:
            checked[name] = obj
    for name, obj in checked.items():
        if name.endswith(".__init__") and name not in stubs:
            # (a class made only by the module: no constructor to stub)
            assert name.split(".")[0] == "StreamSnapshot", name
            continue
        assert stub_parameters(stubs[name]) == runtime_parameters(obj), name
    for name in set(stubs) - set(checked):  # the rest are the classes' properties
        cls, _, attr = name.partition(".")
        decorators = {getattr(d, "id", None) for d in stubs[name].decorator_list}
        assert "property" in decorators and hasattr(getattr(_atomdata, cls), attr), name
    tree = ast.parse(STUB.read_text())
    top = {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    top |= {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    public = {n for n in dir(_atomdata) if not n.startswith("_")}
    assert {n for n in top if not n.startswith("_")} == public, sorted(public ^ top)
    properties = {"size", "signature", "shards", "resident"}
    assert properties <= set(dir(_atomdata.ByteCorpus))
    assert {"B", "pack_mode", "threads", "corpus", "positions"} <= set(dir(data.BatchedByteStream))
    assert {"B", "positions"} <= set(dir(data.StreamSnapshot))


def test_the_package_re_exports_the_api():
    for name in data.__all__:
        assert getattr(data, name) is not None
    assert data.FEATURE_IDS_PER_TICK == 17 and data.FEATURE_ID_PAD == 320
    assert data.FEATURE_DIM == 320 and data.FEATURE_VERSION == 1 and data.HORIZON == 64
    assert data.ByteCorpus.__module__ == "atom_train.data.loader"
    # One exception tree for the extension: the loader's and the field loop's errors.
    from atom_train.model.field_native import AtomFieldError

    assert issubclass(data.AtomError, ValueError)
    assert issubclass(data.AtomDataError, data.AtomError)
    assert issubclass(AtomFieldError, data.AtomError)
    assert not issubclass(AtomFieldError, data.AtomDataError)
    assert issubclass(data.AtomDataIOError, data.AtomDataError)
    assert issubclass(data.AtomDataIOError, OSError)


def test_bench_loader_runs_each_configuration_in_a_subprocess(tmp_path, capsys):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    args = ["loader", "-B", "2", "--threads", "1", "--seconds", "0.05", "-K", "8"]
    args += ["--corpus-mb", "1", "--out", str(out), "--plot", str(png)]
    assert bench.main(args) == 0
    report = json.loads(out.read_text())
    impls = {r["impl"] for r in report["results"]}
    assert impls == {"rust", "rust_ids", "fill", "oracle"}
    for r in report["results"]:
        assert r["bytes_per_s"] > 0 and r["measured_s"] >= 0.05 and r["peak_rss_mb"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    table = capsys.readouterr().out
    assert "rust/fill" in table and "measured s" in table


def test_every_exported_name_is_the_native_modules_or_defined_here():
    """`atom_train.data.loader.__all__` is the API: the native module's own objects (the very
    same, not copies or stand-ins), their values where they are constants, and the one
    helper written in Python."""
    from atom_train import _atomdata

    native = [n for n in data.__all__ if n != "expand_ids"]
    assert all(getattr(data, n) is getattr(_atomdata, n) for n in native), native
    assert data.expand_ids.__module__ == "atom_train.data.loader"
    assert data.PACK_MODES == ["utf8", "plain"]
    assert data.STATE_FORMAT == "atomdata.stream_state" and data.STATE_VERSION == 2
    assert set(data.__all__) == {
        *("FEATURE_DIM", "FEATURE_IDS_PER_TICK", "FEATURE_ID_PAD", "FEATURE_VERSION"),
        *("HORIZON", "PACK_MODES", "STATE_FORMAT", "STATE_VERSION", "AtomDataError"),
        *("AtomDataIOError", "AtomError", "BatchedByteStream", "ByteCorpus", "StreamSnapshot"),
        *("check_state_dict", "encode_bytes", "expand_ids", "join_state_dicts"),
        "stream_offsets",
    }
