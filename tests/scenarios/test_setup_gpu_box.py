"""The GPU-box set-up (scripts/setup_gpu_box.sh), rehearsed on a CPU machine.

Each test runs the real script in a copy of the checkout under a temp dir, with stand-ins from
tests/helpers/fakebin: nvidia-smi reporting a chosen driver (or failing), a system Python whose
`-m venv` makes a fake venv, whose pip records each call and fakes its effect (a stand-in
torch that sees the GPU when the fake driver runs its CUDA), maturin, cargo and gpu_check.sh.
Nothing touches the network, the real .venv or a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import FAKEBIN, REPO

_spec = importlib.util.spec_from_file_location("fakes", FAKEBIN / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

CU126 = "https://download.pytorch.org/whl/cu126"
CU130 = "https://download.pytorch.org/whl/cu130"


@dataclass
class Box:
    """A checkout copy with fake tools: `run` the set-up script there, read what it did."""

    root: Path
    env: dict[str, str]

    @property
    def log(self) -> list[str]:
        path = Path(self.env["FAKE_LOG"])
        return path.read_text().splitlines() if path.exists() else []

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.root / "scripts" / "setup_gpu_box.sh"), *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def preinstall_torch(self, index_url: str | None) -> None:
        """A venv that already holds the torch `index_url` gives, as a previous run left it."""
        (self.root / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy(FAKEBIN / "venv-python", self.root / ".venv" / "bin" / "python")
        fakes.install_torch(Path(self.env["FAKE_SITE"]), index_url)


@pytest.fixture
def box(tmp_path: Path) -> Box:
    """Driver 550.54.15 (CUDA 12.4), a wheel in dist/, no cargo, no .venv yet."""
    root = tmp_path / "atom"
    (root / "scripts").mkdir(parents=True)
    (root / "atom_train").mkdir()
    for name in ("setup_gpu_box.sh", "list_deps.py"):
        shutil.copy(REPO / "scripts" / name, root / "scripts" / name)
    shutil.copy(FAKEBIN / "gpu_check.sh", root / "scripts" / "gpu_check.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    fakes.make_wheel(root / "dist" / fakes.WHEEL_NAME)
    bin_dir = tmp_path / "bin"  # nvidia-smi only: cargo is there when a test says so
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKEBIN / "nvidia-smi")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "LC_ALL": "C",
        "PYTHON": str(FAKEBIN / "python"),
        "REAL_PYTHON": sys.executable,
        "FAKEBIN": str(FAKEBIN),
        "FAKE_LOG": str(tmp_path / "log"),
        "FAKE_SITE": str(tmp_path / "site"),
        "FAKE_DRIVER": "550.54.15",
        "FAKE_CUDA": "12.4",
        "CARGO": "cargo-not-installed",
        "MIN_FREE_GB": "0",
    }
    return Box(root, env)


def pip_torch_installs(box: Box) -> list[str]:
    return [line for line in box.log if line.startswith("pip install torch")]


def refusal(res: subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal prints (exit 2, nothing else on stderr)."""
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


# The driver decides the torch build.


@pytest.mark.parametrize(
    ("driver", "cuda", "index", "why"),
    [
        ("595.58.03", "13.2", None, "natively"),  # new driver: PyPI's default build
        ("590.48.01", "13.1", CU130, "natively"),
        ("580.65.06", "13.0", CU130, "natively"),
        ("570.124.06", "12.8", CU126, "natively"),
        ("550.54.15", "12.4", CU126, "minor-version compatibility"),  # old driver
        ("535.183.01", "12.2", CU126, "minor-version compatibility"),
    ],
)
def test_driver_picks_the_build(box: Box, driver: str, cuda: str, index: str | None, why: str):
    res = box.run("--dry-run", FAKE_DRIVER=driver, FAKE_CUDA=cuda)
    assert res.returncode == 0, res.stderr
    assert f"driver {driver}, CUDA {cuda}" in res.stdout
    choice = next(line for line in res.stdout.splitlines() if "torch: " in line)
    assert why in choice and driver in choice
    torch_cmd = [
        line for line in res.stdout.splitlines() if line.startswith("+ ") and "torch" in line
    ]
    assert len(torch_cmd) == 1, res.stdout
    if index is None:
        assert "PyPI's own build" in choice and "--index-url" not in torch_cmd[0]
    else:
        assert torch_cmd[0].endswith(f"--index-url {index}")
    assert box.log == []  # a dry run changes nothing


def test_driver_too_old_for_any_build(box: Box):
    res = box.run("--dry-run", FAKE_DRIVER="470.256.02", FAKE_CUDA="11.4")
    line = refusal(res)
    assert "driver 470.256.02 is too old" in line and "update the NVIDIA driver" in line
    assert "525.60.13" in line
    assert "+ " not in res.stdout


def test_torch_index_and_spec_from_the_environment(box: Box):
    index = "https://download.pytorch.org/whl/cu128"
    res = box.run("--dry-run", TORCH_INDEX=index, TORCH_SPEC="torch==2.11.0")
    assert res.returncode == 0, res.stderr
    assert f"torch==2.11.0 from TORCH_INDEX={index}" in res.stdout
    assert f"torch==2.11.0 --index-url {index}" in res.stdout


# No usable GPU: one line naming the fix, before anything is installed.


def test_no_nvidia_smi(box: Box):
    line = refusal(box.run(NVIDIA_SMI="nvidia-smi-not-installed"))
    assert "nvidia-smi not found" in line and "--gpus all" in line
    assert box.log == []


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("fail", "the NVIDIA driver is not loaded"),
        ("mismatch", "reboot"),
        ("nogpu", "--gpus all"),
    ],
)
def test_nvidia_smi_fails(box: Box, mode: str, says: str):
    line = refusal(box.run(FAKE_SMI=mode))
    assert "nvidia-smi" in line and says in line
    assert box.log == []


def test_python_too_old(box: Box):
    line = refusal(box.run(PYTHON=str(FAKEBIN / "old-python")))
    assert "no Python >= 3.11" in line and "is 3.9" in line and "PYTHON=" in line


def test_no_disk_space(box: Box):
    line = refusal(box.run(MIN_FREE_GB="1000000000"))
    assert "GB free" in line and "1000000000 needed" in line
    assert box.log == []


# A torch already in the venv.


def test_cpu_only_torch_in_the_venv(box: Box):
    box.preinstall_torch("https://download.pytorch.org/whl/cpu")
    line = refusal(box.run())
    assert "CPU-only" in line and "pip uninstall -y torch" in line
    assert box.log == []


def test_torch_too_new_for_the_driver_is_replaced(box: Box):
    box.preinstall_torch(None)  # PyPI's CUDA 13.2 build, on a 12.4 driver
    res = box.run("--no-check")
    assert res.returncode == 0, res.stderr
    assert "does not see the GPU: it is replaced" in res.stdout
    assert box.log[:2] == [
        "pip uninstall --yes torch",
        f"pip install torch>=2.1 --index-url {CU126}",
    ]
    assert "torch 2.14.0+cu126 (CUDA 12.6)" in res.stdout


def test_torch_that_sees_the_gpu_is_kept(box: Box):
    box.preinstall_torch(CU126)
    res = box.run("--no-check", TORCH_INDEX=CU130)
    assert res.returncode == 0, res.stderr
    assert "sees the GPU: kept (to replace it, uninstall it first" in res.stdout
    assert pip_torch_installs(box) == []


def test_a_build_the_driver_cannot_run_names_an_older_one(box: Box):
    line = refusal(box.run("--no-check", TORCH_INDEX=CU130))  # CUDA 13.0 on a 12.4 driver
    assert "torch 2.14.0+cu130 (CUDA 13.0) does not see the GPU with driver 550.54.15" in line
    assert f"pip uninstall -y torch && TORCH_INDEX={CU126} scripts/setup_gpu_box.sh" in line


def test_hidden_gpus_are_named(box: Box):
    box.preinstall_torch(CU126)
    line = refusal(box.run("--no-check", CUDA_VISIBLE_DEVICES=""))
    assert "CUDA_VISIBLE_DEVICES='' hides it: unset it" in line
    assert pip_torch_installs(box) == []  # the right build: kept, not reinstalled


# The three ways to the project's native module, then a second run.


def test_wheel_in_dist_then_a_second_run_installs_nothing(box: Box):
    res = box.run("out")
    assert res.returncode == 0, res.stderr
    log = box.log
    assert log[0] == "venv .venv"
    assert f"pip install torch>=2.1 --index-url {CU126}" in log
    (deps,) = [line for line in log if line.startswith("pip install --quiet") and "numpy" in line]
    assert "pytest" in deps and "torch" not in deps  # pyproject's list with dev, torch apart
    assert f"pip install --quiet --no-deps --force-reinstall dist/{fakes.WHEEL_NAME}" in log
    assert (box.root / fakes.NATIVE_MODULE).exists()  # next to the checkout's sources
    assert log[-1] == "gpu_check PYTHON=.venv/bin/python out"
    assert "torch 2.14.0+cu126 (CUDA 12.6), triton 3.9.0" in res.stdout

    again = box.run("out")
    assert again.returncode == 0, again.stderr
    assert "nothing to install" in again.stdout
    assert box.log[len(log) :] == ["gpu_check PYTHON=.venv/bin/python out"]

    skipped = box.run("--no-check")
    assert skipped.returncode == 0, skipped.stderr
    assert "--no-check" in skipped.stdout and len(box.log) == len(log) + 1


def test_cargo_builds_the_wheel(box: Box):
    shutil.rmtree(box.root / "dist")
    res = box.run("--no-check", CARGO=str(FAKEBIN / "cargo"))
    assert res.returncode == 0, res.stderr
    assert "maturin builds one" in res.stdout
    assert "maturin build --release --out dist" in box.log
    assert f"pip install --quiet --no-deps --force-reinstall dist/{fakes.WHEEL_NAME}" in box.log
    assert (box.root / fakes.NATIVE_MODULE).exists()
    n = len(box.log)
    again = box.run("--no-check", CARGO=str(FAKEBIN / "cargo"))
    assert "nothing to install" in again.stdout and len(box.log) == n


def test_neither_wheel_nor_cargo(box: Box):
    shutil.rmtree(box.root / "dist")
    line = refusal(box.run())
    assert "no dist/atom_train-*.whl and no cargo" in line and "make wheel" in line
    assert box.log == []


# Optional extras.


def test_extras_are_installed_once_asked(box: Box, tmp_path: Path):
    pyproject = box.root / "pyproject.toml"
    text = pyproject.read_text()
    for extra, package in (("tensorboard", "tensorboard"), ("zstd", "zstandard")):
        if f"\n{extra} = " not in text:  # until pyproject.toml has it
            text = text.replace(
                "[project.optional-dependencies]\n",
                f'[project.optional-dependencies]\n{extra} = ["{package}"]\n',
            )
    pyproject.write_text(text)
    assert box.run("--no-check").returncode == 0
    n = len(box.log)
    res = box.run("--no-check", "--extras", "tensorboard,zstd")
    assert res.returncode == 0, res.stderr
    (deps,) = box.log[n:]  # only the dependencies changed
    assert deps.startswith("pip install --quiet") and "tensorboard" in deps and "zstandard" in deps

    line = refusal(box.run("--dry-run", "--extras", "tensorbord"))
    assert "--extras tensorbord: pyproject.toml has no such extra" in line and "tensorboard" in line
