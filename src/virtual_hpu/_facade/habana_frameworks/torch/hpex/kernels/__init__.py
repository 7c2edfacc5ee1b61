"""``habana_frameworks.torch.hpex.kernels``: Gaudi's fused kernels, computed with torch ops on the virtual Gaudi.

Each gives the result of the published computation it fuses (attention, rotary embeddings, softmax, CTC loss); what
only a Gaudi does (fp8 attention) raises NotImplementedError when called.
"""

from habana_frameworks.torch.hpex.kernels.CTCLoss import CTCLoss
from habana_frameworks.torch.hpex.kernels.CustomSoftmax import CustomSoftmax
from habana_frameworks.torch.hpex.kernels.Fp8FusedSDPA import (
    fp8_fused_sdpa,
    fp8_sdpa_bwd_wrapper,
    fp8_sdpa_fwd_wrapper,
    gqa_output_reshape,
)
from habana_frameworks.torch.hpex.kernels.FusedSDPA import FusedSDPA
from habana_frameworks.torch.hpex.kernels.PySDPA import PySDPA, PySDPAHinted
from habana_frameworks.torch.hpex.kernels.RotaryPosEmbeddingHelper import (
    RotaryPosEmbeddingHelperV1,
    RotaryPosEmbeddingHelperV2,
    RotaryPosEmbeddingHelperV3,
    RotaryPosEmbeddingMode,
    apply_rotary_pos_emb,
)
from habana_frameworks.torch.utils.internal import is_lazy

__all__ = [
    "CTCLoss",
    "CustomSoftmax",
    "FusedSDPA",
    "PySDPA",
    "PySDPAHinted",
    "RotaryPosEmbeddingHelperV1",
    "RotaryPosEmbeddingHelperV2",
    "RotaryPosEmbeddingHelperV3",
    "RotaryPosEmbeddingMode",
    "apply_rotary_pos_emb",
    "fp8_fused_sdpa",
    "fp8_sdpa_bwd_wrapper",
    "fp8_sdpa_fwd_wrapper",
    "gqa_output_reshape",
    "is_lazy",
]
