"""Route codecs: recorded ids in as few bytes as they need (raw, bit-packed, top-k sets)."""
