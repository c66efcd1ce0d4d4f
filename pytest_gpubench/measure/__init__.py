"""One load-generator pass, repeats and statistics, metrics, validity, thresholds and comparison with a baseline."""
