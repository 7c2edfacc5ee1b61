"""``habana_frameworks.torch.hpex.experimental``."""
