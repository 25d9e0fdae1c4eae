"""The trainer's components: the flag table, the run plan, checkpoints (file, content,
manager), the window step, prefetch, reporting, logs, the run folder, distributed.
"""
