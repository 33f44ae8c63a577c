"""vLLM: capture switches per release, the offline ``RequestOutput``, the HTTP and streamed
answers, the batch fast path, ``prompt_start`` (G4) and the 0.32+ aux-output store."""
