"""FedRoD's losses (Chen & Chao, ICLR 2022, section 4; torch, imported inside each function).

Generic head, the balanced-softmax loss (section 4's balanced risk; the loss of Ren et al.,
NeurIPS 2020) on the client's label counts n_c:

    L_BSM(z, y) = -log( n_y exp(z_y) / sum_c n_c exp(z_c) ) = CE(z + log n, y)

(log n_c rather than log(n_c / n): the constant log n cancels in the softmax).  A class the
client never saw has n_c = 0: its logit is -inf, its softmax weight 0.

Personal head, the personalized predictor z^G + z^P (section 4: the personalized model adds
the two heads' outputs) under plain cross-entropy, the generic logits and the body's
features detached (the personal head alone learns from it):

    L_P = CE(stopgrad(z^G) + z^P, y)

A training step minimises L_BSM + L_P; their gradients reach disjoint parameters (body and
generic head; personal head).  The model's output during training is the two logit blocks
side by side, ``[z^G | z^P]`` (B x 2C): :func:`two_head_loss` splits it.
"""

from __future__ import annotations

from typing import Any, Callable


def label_counts(y: Any, num_classes: int) -> Any:
    """n_c, the count of each class in the label tensor ``y`` (float, length C)."""
    import torch

    return torch.bincount(y.long().flatten(), minlength=num_classes).to(torch.float32)


def balanced_softmax_loss(logits: Any, y: Any, counts: Any) -> Any:
    """Mean L_BSM over the batch: CE(logits + log n, y).  ``logits`` (B x C), ``y`` (B,),
    ``counts`` (C,) the client's label counts (0 allowed for a class not in ``y``)."""
    from torch.nn import functional as F

    return F.cross_entropy(logits + counts.to(logits).log(), y)


def two_head_loss(labels: Any) -> Callable[[Any, Any], Any]:
    """The loss of a training step on ``[z^G | z^P]`` (B x 2C): L_BSM(z^G) + L_P, with the
    counts n_c of the client's whole training labels ``labels`` (not the batch's)."""
    from torch.nn import functional as F

    counts: dict[int, Any] = {}

    def loss(out: Any, y: Any) -> Any:
        c = out.shape[1] // 2
        if c not in counts:
            counts[c] = label_counts(labels, c)
        generic, personal = out[:, :c], out[:, c:]
        return (balanced_softmax_loss(generic, y, counts[c])
                + F.cross_entropy(generic.detach() + personal, y))
    return loss
