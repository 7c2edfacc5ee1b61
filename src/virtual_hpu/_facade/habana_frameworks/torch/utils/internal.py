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
    """Run ``function`` in lazy mode; in eager mode do nothing and log so once, as the bridge's lazy-only calls
    (``mark_step``, ``iter_mark_step``, ``add_step_closure``) do."""
    warned = False

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        nonlocal warned
        if is_lazy():
            function(*args, **kwargs)
        elif not warned:
            warned = True
            logger.warning("%s has no effect in eager mode: it belongs to lazy mode (PT_HPU_LAZY_MODE=1)",
                           function.__name__)  # fmt: skip

    return wrapper
