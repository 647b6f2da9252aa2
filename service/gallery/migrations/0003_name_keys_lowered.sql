-- A unique name's key is lowered, no longer case-folded (service/gallery/names.py: Strauß and
-- STRAUSS are two names). PostgreSQL's lower() depends on the database's collation, so the keys are
-- made again in Python right after this file, in the same transaction (postgres.py,
-- _lower_name_keys); old keys were unique, and lowering tells apart at least what folding did.
-- This file records the step and checks the index it relies on is there.
SELECT 1 FROM pg_indexes WHERE indexname = 'subjects_name_key';
