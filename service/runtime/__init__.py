"""The process model of a host: where model runs and decodes execute. A request's thread hands
them to this process's micro-batchers (`local_models`, `batching`) or to the model host process
(`model_host`, kept alive by its `supervisor`, reached through `hosted_models` and the `shm_arena`
each worker shares with it, in `wire`'s messages); images are probed and decoded in `decode_workers`
processes. docs/architecture.md draws them."""
