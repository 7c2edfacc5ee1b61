"""The HPU tests run on the virtual Gaudi unless a real Gaudi software stack is installed.

This runs before any test module imports ``pytorch_lightning``, which activates the virtual device from the
environment; subprocesses started by the tests inherit the setting.
"""

import importlib.util
import os

if "VIRTUAL_HPU" not in os.environ and importlib.util.find_spec("habana_frameworks") is None:
    os.environ["VIRTUAL_HPU"] = "1"


import pytest
import torch.distributed


@pytest.fixture(autouse=True)
def restore_environment_and_process_group():
    """Undo what an in-process run leaves behind: Lightning's launcher writes ``MASTER_PORT``, ``LOCAL_RANK``,
    ``WORLD_SIZE`` ... into ``os.environ``, and a later subprocess would take them for an external launch."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
