"""The HPU tests run on the virtual Gaudi unless a real Gaudi software stack is installed.

This runs before any test module imports ``pytorch_lightning``, which activates the virtual device from the
environment; subprocesses started by the tests inherit the setting.
"""

import importlib.util
import os

if "VIRTUAL_HPU" not in os.environ and importlib.util.find_spec("habana_frameworks") is None:
    os.environ["VIRTUAL_HPU"] = "1"
