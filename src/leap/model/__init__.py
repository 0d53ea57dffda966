"""The predictor: the median cascade, the artifact it is published as, and nightly training."""
