"""Open-domain QA shared by the environments: answer normalisation and matching, FlashRAG rows."""
