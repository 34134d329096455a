"""Where a job's files live: local paths, or URLs read and written through fsspec."""
