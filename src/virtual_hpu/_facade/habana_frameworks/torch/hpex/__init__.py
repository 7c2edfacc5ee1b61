"""``habana_frameworks.torch.hpex``: Gaudi extensions beyond core PyTorch (of them, the virtual Gaudi has fp8)."""
