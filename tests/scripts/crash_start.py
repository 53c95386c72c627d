"""Fails before training, as a script with a bad configuration does."""

raise ValueError("bad config: lr must be positive")
