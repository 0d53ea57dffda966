"""Features: the history snapshot as of a time, and the one encode() for training and serving."""
