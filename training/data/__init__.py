"""Training data: aligned face folders, InsightFace RecordIO, augmentation, and `facegate align`."""
