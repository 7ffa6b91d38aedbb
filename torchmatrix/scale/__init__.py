"""Fan-out: merging run directories, the GitHub Actions job matrix, Slurm array scripts."""
