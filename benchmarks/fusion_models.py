"""Ultralytics YOLOv8n for the fusion benchmarks: random weights, inference mode. Ultralytics is a
benchmark dependency only (never imported by the torch2ms package); YOLO_OFFLINE=1 keeps it off
the network."""

from __future__ import annotations

import os


def yolov8n():
    """``YOLO("yolov8n.yaml").model`` in eval mode (built from the YAML: no download)."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO

    return YOLO("yolov8n.yaml").model.eval()
