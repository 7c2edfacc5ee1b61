"""Messages of upstream Lightning and of dependencies that do not concern the user's run, each silenced alone.

Never a blanket filter: every entry names the one message, its category or logger, and where it comes from, so that
anything else those sources say still shows. The causes that are ours are fixed where they are instead (the virtual
Gaudi registers the DDP timer torch asks of a device, the SIGTERM agreement's group names its default backend).
"""

import logging
import re
import warnings


class _DropMessages(logging.Filter):
    """Drops the records of one logger whose message matches ``pattern``."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


# (logger, message): torchao (pulled in by Intel Neural Compressor, imported by `transformers`) tries its CUDA kernel
# libraries on every import and logs each one a CPU-only or Gaudi torch cannot load; and it registers enums with
# torch's pytree in the way torch has deprecated for library authors, which torch logs once per enum
_LOGGED = (
    ("torchao", r"^Failed to load .*/torchao/_C[^/]*\.so: Could not load this library"),
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch\.compile as an opaque value"),
)


def quiet_known_noise() -> None:
    """Silence the messages above; idempotent."""
    for name, pattern in _LOGGED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_DropMessages(pattern))
    # upstream Lightning 2.6 builds torch's deprecated `LeafSpec` in its pytree helper at every training step
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
