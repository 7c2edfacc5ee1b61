"""``torch.optim.AdamW`` with the lazy graph cut around each parameter group's state set-up."""

import torch

from habana_frameworks.torch.hpex.optimizers._markstep import CutAroundStateSetUp


class AdamW(CutAroundStateSetUp, torch.optim.AdamW):
    """``torch.optim.AdamW`` (same arguments and update) with the lazy graph cut around each parameter group's state
    set-up, as Gaudi's ``MarkstepAdamW`` does."""
