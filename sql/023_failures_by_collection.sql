-- A failure names its collection where one is known (a file's failure in an ingest or a Dagster
-- stage), so `rag status --collection X` lists X's failures and not every collection's. A whole
-- run's failure (the run-failure sensor) has none and is shown for every collection.
ALTER TABLE rag_failures ADD COLUMN IF NOT EXISTS collection text;
