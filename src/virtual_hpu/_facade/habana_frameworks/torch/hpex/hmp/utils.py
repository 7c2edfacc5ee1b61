"""Turning HMP's casts off for a region."""

from contextlib import AbstractContextManager

import torch


def disable_casts() -> AbstractContextManager:
    """A context in which no op is cast (ops run in the dtypes of their inputs): ``torch.autocast("hpu")`` off."""
    return torch.autocast("hpu", enabled=False)
