"""The trainer's components: the flag table, the run plan, checkpoints (file, content,
manager), the training loop, the window step, prefetch, reporting, logs, the run folder,
distributed.
"""
