"""Host-side code around an exported model: what runs before and after the network on the board.

``yolo`` is numpy only (no torch, torchvision or ultralytics) because a bundle copies it in as
``postprocess.py`` and runs it on a board that has none of them; ``image`` turns photos into
sample inputs for the checks.
"""
