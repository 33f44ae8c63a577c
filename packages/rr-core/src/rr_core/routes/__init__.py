"""Route batches (jagged recorded expert ids), their layer axes, and the checks on route data."""
