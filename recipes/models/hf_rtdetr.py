"""HuggingFace transformers' RT-DETR detector from its default config (ResNet-50-vd backbone,
hybrid encoder, 300 queries, 80 classes), random seeded weights: nothing is downloaded.

``rtdetr()`` returns the model wrapped to give ``logits`` [1, 300, 80] and ``pred_boxes`` [1, 300, 4]
(cx, cy, w, h in [0, 1]) as a dict of tensors, not transformers' ``ModelOutput``.
"""

from __future__ import annotations


def rtdetr(**config):
    import torch
    from transformers import RTDetrConfig, RTDetrForObjectDetection

    model = RTDetrForObjectDetection(RTDetrConfig(**config)).eval()

    class Detections(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, pixel_values):
            out = self.model(pixel_values=pixel_values)
            return {"logits": out.logits, "pred_boxes": out.pred_boxes}

    return Detections(model).eval()
