"""Layer layout: which decoder layers are MoE, which pipeline stage holds them, and moving route
tensors between the all-layers and MoE-layers axes."""
