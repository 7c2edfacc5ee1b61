"""Internal helpers some integrations (DeepSpeed) read."""

import logging
from functools import wraps
from typing import Any, Callable

logger = logging.getLogger(__name__)


def is_lazy() -> bool:
    """Whether lazy mode is on (``PT_HPU_LAZY_MODE``, default 0), as read at activation."""
    import virtual_hpu

    return virtual_hpu.config().lazy


def lazy_only(function: Callable[..., None]) -> Callable[..., None]:
    """``function`` in lazy mode; in eager mode a call that does nothing, logged once when the function is defined (at
    import), in the bridge's words, as its lazy-only calls (``mark_step``, ``iter_mark_step``, ``add_step_closure``)
    do."""
    if is_lazy():
        return function
    logger.warning(
        f"Calling {function.__name__} function does not have any effect. It's lazy mode only functionality."
        " (warning logged once)"
    )

    @wraps(function)
    def non_lazy_wrapper(*args: Any, **kwargs: Any) -> None:
        return None

    return non_lazy_wrapper
