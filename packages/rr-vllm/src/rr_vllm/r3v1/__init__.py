"""The R3/v1 router-replay envelope of hosted RL traces."""
