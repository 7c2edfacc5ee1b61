"""PyTorch's device-backend autoload: ``import torch`` activates the virtual Gaudi, as it loads the real bridge.

Current Gaudi software loads itself on ``import torch`` in eager mode (entry point group ``torch.backends``), so a
library that asks torch for its accelerator before anything of Gaudi's is imported (``transformers`` does) sees the
HPU. The virtual Gaudi does the same when ``VIRTUAL_HPU=1``, with the bridge's switches: ``PT_HPU_AUTOLOAD=0/1``
overrides the default, which is on in eager mode and off in lazy mode. PyTorch's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns off every backend's autoload.
"""

import os


def autoload() -> None:
    """Activate the virtual Gaudi when it is asked for and autoload applies; called by ``import torch``."""
    if os.environ.get("VIRTUAL_HPU", "").strip() != "1" or not _autoload_wanted():
        return
    import virtual_hpu

    virtual_hpu.activate_from_env()


def _autoload_wanted() -> bool:
    flag = os.environ.get("PT_HPU_AUTOLOAD", "").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"PT_HPU_AUTOLOAD must be 1 (load on `import torch`) or 0 (do not), got {flag!r}")
    if flag:
        return flag == "1"
    return os.environ.get("PT_HPU_LAZY_MODE", "0").strip() != "1"
