"""Is the judge fit for this task: calibration against near misses, and agreement between judges."""
