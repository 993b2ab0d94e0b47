"""Pure functions of numbers: paired comparisons, the group-sequential test, non-inferiority."""
