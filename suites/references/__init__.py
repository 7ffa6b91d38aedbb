"""What a cell is compared against: the single-process reference in lockstep, the eager twin, the for-loop optimizer twin."""
