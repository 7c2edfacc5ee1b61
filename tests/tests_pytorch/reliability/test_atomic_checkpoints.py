"""A checkpoint save killed at any moment leaves a loadable checkpoint under the final name: the previous one, or the
complete new one, never a partial file."""

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from pytorch_lightning.plugins import HPUCheckpointIO

MEGABYTES = 128


def _identity(path: Path) -> tuple:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _checkpoints(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.suffix == ".ckpt")


def _kill_when_it_appears(scenario, path: Path) -> None:
    deadline = time.monotonic() + 240
    while not path.exists() and scenario.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    scenario.kill()


@pytest.fixture(scope="module")
def saves(run_module, tmp_path_factory):
    """Two runs saving ``last.ckpt`` after steps 1 and 2, started together.

    ``stalled``: the second save stalls while serialising, and the test kills it there. ``watched``: killed at the
    first sign of ``last.ckpt``, with its temp directory on another file system than the checkpoints (``/dev/shm``,
    when it is one): upstream's transaction then copies the temporary file onto the final name.
    """
    root = tmp_path_factory.mktemp("saves")
    shm = Path("/dev/shm")
    temp_dir = tempfile.mkdtemp(dir=shm if shm.is_dir() and shm.stat().st_dev != root.stat().st_dev else root)
    stalled = run_module("save", "--dir", str(root / "stalled"), "--megabytes", "16", "--slow")
    watched = run_module("save", "--dir", str(root / "watched"), "--megabytes", str(MEGABYTES), TMPDIR=temp_dir)
    watcher = threading.Thread(target=_kill_when_it_appears, args=(watched, root / "watched" / "last.ckpt"))
    watcher.start()
    yield {"root": root, "stalled": stalled, "watched": watched, "watcher": watcher}
    watcher.join()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.heavy
def test_killed_save_leaves_the_previous_checkpoint(saves):
    directory, save = saves["root"] / "stalled", saves["stalled"]
    save.wait_for("saved step 1")
    last = directory / "last.ckpt"
    previous = _identity(last)
    # the second save of last.ckpt stalls while serialising (a writer that opened the final name has truncated it)
    save.wait_for("stalled inside save_checkpoint")
    save.kill()
    assert save.process.returncode == -9

    assert _identity(last) == previous
    checkpoint = _load(last)
    assert checkpoint["global_step"] == 1
    assert checkpoint["state_dict"]["ballast"].numel() == 16 * 2**18
    # the unfinished file is not a checkpoint: `ckpt_path="last"` and listings skip it
    assert _checkpoints(directory) == ["last.ckpt"]


def test_checkpoint_appears_complete_even_across_file_systems(saves):
    saves["watcher"].join()
    watched = saves["watched"]
    assert watched.process.returncode == -9, watched.output[-3000:]  # killed, not finished
    checkpoint = _load(saves["root"] / "watched" / "last.ckpt")
    assert checkpoint["global_step"] == 1
    assert checkpoint["state_dict"]["ballast"].numel() == MEGABYTES * 2**18


def test_save_renames_within_the_directory_and_cleans_up_on_failure(tmp_path, monkeypatch):
    io = HPUCheckpointIO()
    path = tmp_path / "run" / "last.ckpt"
    renames = []
    replace = os.replace

    def recording_replace(source, target):
        renames.append((source, target))
        replace(source, target)

    monkeypatch.setattr(os, "replace", recording_replace)
    io.save_checkpoint({"weights": torch.ones(3, device="hpu")}, f"file://{path}")
    ((source, target),) = renames
    assert Path(source).parent == path.parent and not source.endswith(".ckpt") and target == str(path)
    loaded = io.load_checkpoint(path)
    assert loaded["weights"].device.type == "cpu" and loaded["weights"].tolist() == [1.0, 1.0, 1.0]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as any file the user writes, not mkstemp's 0o600
    # a save that fails leaves the previous checkpoint and no temporary file
    with pytest.raises(Exception, match="lambda"):
        io.save_checkpoint({"weights": torch.zeros(3), "hook": lambda: None}, path)
    assert io.load_checkpoint(path)["weights"].tolist() == [1.0, 1.0, 1.0]
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_remote_paths_and_storage_options_go_to_upstream():
    io = HPUCheckpointIO()
    io.save_checkpoint({"weights": torch.ones(2, device="hpu")}, "memory://reliability/last.ckpt")
    assert io.load_checkpoint("memory://reliability/last.ckpt")["weights"].device.type == "cpu"
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint({}, "unused.ckpt", storage_options={"compression": None})
