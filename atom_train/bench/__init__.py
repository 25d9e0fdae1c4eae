"""`python -m atom_train.bench`: bytes/s of the loader and of the training step, and
the CUDA kernel timings.
"""
