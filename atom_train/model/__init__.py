"""The field model: its config, parameters and single-stream reference, the lockstep
rules, the batched tick and its field loops (torch, Triton, native), scoring and sampling.
"""
