"""Multi-turn trajectories gathered turn by turn without re-sending prefix routes (G6)."""
