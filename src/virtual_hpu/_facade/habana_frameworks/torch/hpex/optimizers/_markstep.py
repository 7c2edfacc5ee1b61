"""The lazy graph cut that Gaudi's ``MarkstepAdam`` and ``MarkstepAdamW`` add to torch's optimizers."""

from habana_frameworks.torch import core as htcore


class CutAroundStateSetUp:
    """Cuts the lazy graph before and after a torch optimizer gathers each parameter group's tensors and creates their
    state, so that a first step's state creation and the update compile as separate graphs."""

    def _init_group(self, *args, **kwargs):
        htcore.mark_step()
        has_complex = super()._init_group(*args, **kwargs)
        htcore.mark_step()
        return has_complex
