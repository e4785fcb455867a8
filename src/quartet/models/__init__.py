"""Loading Hugging Face causal LMs and value models from local folders, and the tiny-model kit."""
