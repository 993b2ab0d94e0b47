"""The thing being optimized: the RAG program, retrieval, the QA template and the search's dimensions, and what an answer costs."""
