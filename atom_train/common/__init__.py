"""Shared plumbing of every layer: user errors and command-line helpers, atomic
file writes, measuring, figures. No torch; matplotlib only when a figure is drawn.
"""
