"""`torchrun --nproc_per_node=N -m training CONFIG.yaml [--set key=value ...] [--resume PATH]`."""

from training.commands.train import train_main

train_main()
