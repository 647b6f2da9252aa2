"""Imported last by the workers' forkserver (`preload.PRELOAD`) and nowhere else: `gc.freeze()`
moves every object the preloaded imports made to the collector's permanent generation, so that a
forked worker's collections never write to their pages and they stay shared with the forkserver."""

import gc

gc.freeze()
