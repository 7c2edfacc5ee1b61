"""``hmp.convert``: HMP's mixed precision, as ``torch.autocast("hpu")`` with HMP's op lists."""

import warnings
from pathlib import Path
from typing import Optional

import torch

# HMP's O2: matrix products and convolutions in bf16 (``linear`` and ``matmul`` are how autocast sees the products
# HMP's list names), everything else as O1's fp32 list says
_O2_BF16_OPS = (
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "bmm",
    "addmm",
    "mm",
    "mv",
    "dot",
    "linear",
    "matmul",
)


def convert(opt_level: str = "O1", bf16_file_path: str = "", fp32_file_path: str = "", isVerbose: bool = False) -> None:
    """Run the rest of the program (this thread: the training loop's) in HMP's bf16 mixed precision.

    On the virtual Gaudi this turns ``torch.autocast("hpu", dtype=torch.bfloat16)`` on for good, with the ops of
    ``bf16_file_path`` in bf16 and those of ``fp32_file_path`` in fp32 (one op name per line, HMP's or aten's names;
    an empty path keeps the device's current list, by default Gaudi's documented autocast lists). ``opt_level="O2"``
    runs matrix products and convolutions in bf16 instead of the file's list. Ops in neither list run in the dtype of
    their inputs, as HMP ran them. Autocast's cache of cast weights is turned off, since no autocast region ends to
    empty it between optimizer steps. ``disable_casts()`` turns the casts off for a region.
    """
    from virtual_hpu import autocast

    if opt_level not in ("O1", "O2"):
        raise ValueError(f"hmp.convert(opt_level={opt_level!r}) is not supported: use 'O1' (op lists) or 'O2'.")
    lower = _op_list(bf16_file_path, "bf16_file_path") if opt_level == "O1" else list(_O2_BF16_OPS)
    fp32 = _op_list(fp32_file_path, "fp32_file_path")
    warnings.warn(
        "Habana Mixed Precision (hpex.hmp) was removed in Gaudi software 1.13: on a Gaudi this script needs an older"
        " release. Use `torch.autocast('hpu', dtype=torch.bfloat16)` or `Trainer(precision='bf16-mixed')` instead.",
        FutureWarning,
        stacklevel=2,
    )
    autocast.set_op_lists(lower, fp32)
    torch.set_autocast_dtype("hpu", torch.bfloat16)
    torch.set_autocast_cache_enabled(False)
    torch.set_autocast_enabled("hpu", True)
    if isVerbose:
        current_lower, current_fp32 = autocast.op_lists()
        print(f"hmp: opt_level {opt_level}, bf16 ops {list(current_lower)}, fp32 ops {list(current_fp32)}")


def _op_list(path: str, argument: str) -> Optional[list[str]]:
    if not path:
        return None
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"hmp.convert({argument}={path!r}): no such file. Pass a text file with one op name per line, or ''"
            " for the default list."
        )
    return [line.strip() for line in file.read_text().splitlines() if line.strip()]
