"""facegate inference service: decode → detect → align → embed, and the HTTP API on top.

Never imports torch or `training`: the serving image carries onnxruntime only.
"""

__version__ = "0.1.0"
