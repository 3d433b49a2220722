"""Knowledge graph: extraction from documents (`extract`), queries (`queries`), hybrid context (`hybrid`)."""
