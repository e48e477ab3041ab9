"""Composite torch ops fuser_ex owns, with forward and backward rules of its own."""
