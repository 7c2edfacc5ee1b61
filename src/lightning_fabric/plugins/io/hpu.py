"""Checkpoint I/O for Intel Gaudi: checkpoints hold CPU tensors, so they load anywhere."""

import contextlib
import os
import uuid
from typing import Any, Optional

import torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.types import _PATH
from typing_extensions import override


class HPUCheckpointIO(TorchCheckpointIO):
    """Saves checkpoints with every tensor moved to the CPU first, written atomically.

    The default of the HPU strategies. A checkpoint written by it loads on a machine without Gaudi as well as on HPUs
    (the strategy moves the weights back to its device). Pass another ``CheckpointIO`` in ``Trainer(plugins=...)`` to
    replace it.

    On a local or mounted file system, a killed save leaves the file under the final name as it was (the previous
    checkpoint, or none) and at most a ``.<name>.<random>.tmp`` file next to it. Remote paths (``s3://``, ...) go
    through upstream's file-system transaction.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        checkpoint = move_data_to_device(checkpoint, torch.device("cpu"))
        # upstream also reports `storage_options`, which a local file has no use for
        fs, local_path = url_to_fs(str(path))
        if storage_options is not None or not isinstance(fs, LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        _save_atomically(checkpoint, local_path)


def _save_atomically(checkpoint: dict[str, Any], path: str) -> None:
    """Write to a temporary file in the target's directory, flush it to disk, then rename it over the target.

    Upstream's transaction writes the temporary file to the system's temp directory and moves it into place: when that
    is another file system than the checkpoint's (``/tmp`` and a data volume), the move is a copy onto the final name,
    which first truncates the previous checkpoint. A rename within one directory replaces the file in one step.
    """
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # not ending in ".ckpt", so that `ckpt_path="last"` and checkpoint listings never pick up an unfinished file
    temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(temporary, "xb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """Make the rename itself durable, where the file system supports it."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
