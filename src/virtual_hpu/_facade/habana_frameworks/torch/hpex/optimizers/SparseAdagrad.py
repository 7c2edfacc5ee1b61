"""``habana_frameworks.torch.hpex.optimizers.SparseAdagrad``: Gaudi's Adagrad kernel for embedding rows with valid
counts."""


def forward(*args, **kwargs):
    raise NotImplementedError(
        "The virtual Gaudi does not model `SparseAdagrad.forward` (a TPC kernel for sparse embedding updates with"
        " valid counts). Use dense gradients with `hpex.optimizers.FusedAdagrad` or `torch.optim.Adagrad`."
    )
