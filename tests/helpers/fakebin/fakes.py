"""The effects of pip and maturin, faked for the set-up rehearsal (tests/scenarios/test_setup_gpu_box.py).

    fakes.py pip VENV_BIN ARGS...   what `VENV_BIN/python -m pip ARGS...` would leave behind
    fakes.py maturin ARGS...        `maturin build --out DIR`: a fake atom_train wheel in DIR

"Installing" torch writes a stand-in torch (and triton) package into $FAKE_SITE, the only
site the fake venv's python sees. Its build follows the index it came from, as PyTorch's
indexes do (cuXYZ: CUDA X.Y, cpu: none, PyPI: the newest CUDA), and it sees the GPU when the
fake driver ($FAKE_SMI, $FAKE_CUDA) runs its CUDA major version, unless CUDA_VISIBLE_DEVICES
hides every GPU. Runs with `python -S`:
standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

FAKEBIN = Path(__file__).resolve().parent
WHEEL_NAME = "atom_train-0.1.0-cp311-abi3-manylinux_2_34_x86_64.whl"
NATIVE_MODULE = "atom_train/_atomdata.abi3.so"

TORCH_INIT = '''"""Stand-in for torch {version}, written by tests/helpers/fakebin/fakes.py."""
import os

__version__ = {version!r}


class version:
    cuda = {cuda!r}


class cuda:
    @staticmethod
    def is_available():
        if version.cuda is None or os.environ.get("FAKE_SMI", "ok") != "ok":
            return False
        if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
            return False
        driver_major = int(os.environ["FAKE_CUDA"].split(".")[0])
        return int(version.cuda.split(".")[0]) <= driver_major

    @staticmethod
    def get_device_name(index=0):
        return "NVIDIA H100 80GB HBM3 (fake)"
'''


def torch_build(index_url: str | None) -> tuple[str, str | None]:
    """(version, CUDA version or None) of the torch that pip would take from `index_url`."""
    if index_url is None:
        return "2.15.0+cu132", "13.2"
    if index_url.rstrip("/").endswith("/cpu"):
        return "2.15.0+cpu", None
    m = re.search(r"/cu(\d+)(\d)/?$", index_url)
    if m is None:
        raise SystemExit(f"fake pip: no torch on {index_url}")
    return f"2.14.0+cu{m[1]}{m[2]}", f"{m[1]}.{m[2]}"


def install_torch(site: Path, index_url: str | None) -> None:
    """Writes the stand-in torch and triton packages that `index_url` would give into `site`."""
    version, cuda = torch_build(index_url)
    (site / "torch").mkdir(parents=True, exist_ok=True)
    (site / "torch" / "__init__.py").write_text(TORCH_INIT.format(version=version, cuda=cuda))
    (site / "triton").mkdir(exist_ok=True)
    (site / "triton" / "__init__.py").write_text('__version__ = "3.9.0"\n')


def make_wheel(path: Path) -> Path:
    """A wheel-shaped zip holding only the native module, as the set-up script reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(NATIVE_MODULE, b"\x7fELF fake native module")
        z.writestr("atom_train/__init__.py", "")
    return path


def pip(venv_bin: Path, args: list[str]) -> None:
    site = Path(os.environ["FAKE_SITE"])
    command, rest = args[0], args[1:]
    names = [a for a in rest if not a.startswith("-")]
    if command == "uninstall":
        if "torch" in names:
            shutil.rmtree(site / "torch", ignore_errors=True)
        return
    index_url = rest[rest.index("--index-url") + 1] if "--index-url" in rest else None
    names = [n for n in names if n != index_url]
    if any(re.match(r"torch([^\w.-]|$)", n) for n in names):
        install_torch(site, index_url)
    if any(n.startswith("maturin") for n in names):
        shutil.copy(FAKEBIN / "maturin", venv_bin / "maturin")


def maturin(args: list[str]) -> None:
    if args[0] == "build":
        make_wheel(Path(args[args.index("--out") + 1]) / WHEEL_NAME)


if __name__ == "__main__":
    if sys.argv[1] == "pip":
        pip(Path(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1] == "maturin":
        maturin(sys.argv[2:])
