"""Version of this distribution: the upstream ``lightning`` core it is built and tested on, plus ``+hpu``."""

__version__ = "2.6.6+hpu"
