"""The solve engine: plan graphs into batches, solve them, run the batches locally or on Ray, cache the results."""
