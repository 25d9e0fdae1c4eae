"""`python -m atom_train.preflight`: the planned run measured here and projected to its end."""
