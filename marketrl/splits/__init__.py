"""Walk-forward folds, the rows each split selects, device-resident splits and their normalization."""
