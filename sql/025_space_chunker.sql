-- The chunker a space's provider cuts text with: its tokenizer's definition and input limit
-- (rag_lib.tokens.chunker_key; NULL: not known yet). When a re-embed switches between two spaces
-- with the same one, the documents' stored outputs are carried over to the new space, so settings
-- naming it find them current instead of republishing every document (rag_lib.reembed.carry_over).
ALTER TABLE rag_spaces ADD COLUMN IF NOT EXISTS chunker text;
