"""``habana_frameworks.torch.hpex``: Gaudi extensions beyond core PyTorch (of them, the virtual Gaudi has
fp8, ``optimizers``, ``normalization``, ``movingavrg`` and ``hmp``). Submodules are imported by name, as on Gaudi."""
