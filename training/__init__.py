"""facegate training: backbones, margin heads, data, the training loop, evaluation and export.

Importing this package does not import torch, so `facegate` starts without it; the modules that
need torch import it themselves.
"""
