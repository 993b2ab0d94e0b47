"""What a run reads: documents, the corpus, golden datasets and their splits, generated questions."""
