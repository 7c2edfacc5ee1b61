"""``torch.optim.Adam`` with the lazy graph cut around each parameter group's state set-up."""

import torch

from habana_frameworks.torch.hpex.optimizers._markstep import CutAroundStateSetUp


class Adam(CutAroundStateSetUp, torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments and update) with the lazy graph cut around each parameter group's state
    set-up, as Gaudi's ``MarkstepAdam`` does."""
