"""The corpus builder: a user's files to train shards and a held-out val
(`python -m atom_train.corpus`). No torch.
"""
