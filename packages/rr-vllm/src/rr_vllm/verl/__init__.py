"""verl's rollout side: rr's codec payload in place of verl's int16 ``routed_experts``, and its
expansion into the tensors verl's trainers read."""
