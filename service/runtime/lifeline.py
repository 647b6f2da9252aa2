"""Imported first by the workers' forkserver (`preload.PRELOAD`) and nowhere else: the forkserver
dies with `facegate serve`, and every process it forks (the HTTP workers, their decoders, the model
host) dies with the forkserver (`preload.die_with_parent`). multiprocessing learns of its children's
exits from their forkserver: once it is gone, uvicorn and the supervisor take every worker and the
host for dead and start others, and their kill no longer signals the old ones, which went on serving
as orphans that nothing would stop, shutdown included; nor did anything stop the workers when
`facegate serve` itself was killed outright."""

import functools
import os

from service.runtime.preload import die_with_parent

die_with_parent()  # this forkserver, with `facegate serve`
os.register_at_fork(after_in_child=functools.partial(die_with_parent, os.getpid()))  # each child, with this forkserver
