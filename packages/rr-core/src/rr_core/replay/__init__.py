"""The replay path: the controller that records and replays per router and micro-batch, the
replayed top-k step, target checks, the model walk that finds routers, and R3 alignment."""
