"""The journal: what a turn records, and how records are encoded."""
