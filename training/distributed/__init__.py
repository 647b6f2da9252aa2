"""Multi-process training: the process group (`process_group`) and the model-parallel head
(`sharded_head`). Importing this package imports neither."""
