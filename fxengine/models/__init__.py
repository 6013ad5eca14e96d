"""Model wire formats: what an API sends and how it is decoded."""
