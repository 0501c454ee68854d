"""Analysis of finished run directories: comparisons and statistics, noise, in-server host time, plots."""
