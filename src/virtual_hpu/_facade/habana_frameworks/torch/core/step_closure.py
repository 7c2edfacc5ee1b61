"""Helpers to cut lazy graphs around steps."""

from habana_frameworks.torch.core import is_lazy, mark_step


def _mark_step_if_lazy() -> None:
    if is_lazy():
        mark_step()
