"""``CTCLoss``: Gaudi's connectionist temporal classification loss, the loss of :func:`torch.nn.functional.ctc_loss`."""

import torch


class CTCLoss:
    """``CTCLoss.apply(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
    zero_infinity=False)``: torch's CTC loss, differentiable with respect to ``log_probs``, computed in float32 (torch
    has no bfloat16 CTC loss on the host) and returned in the dtype of ``log_probs``."""

    @staticmethod
    def apply(
        log_probs: torch.Tensor,
        targets: torch.Tensor,
        input_lengths: torch.Tensor,
        target_lengths: torch.Tensor,
        blank: int = 0,
        reduction: str = "mean",
        zero_infinity: bool = False,
    ) -> torch.Tensor:
        loss = torch.nn.functional.ctc_loss(
            log_probs.float(), targets, input_lengths, target_lengths, blank, reduction, zero_infinity
        )
        return loss.to(log_probs.dtype)
