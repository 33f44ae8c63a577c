"""SGLang: request fields, ``meta_info`` and the OpenAI-compatible answers, streamed or not."""
