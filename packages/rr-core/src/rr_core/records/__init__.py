"""Record files: checksummed, atomically written route files, one shard per rank plus an index."""
