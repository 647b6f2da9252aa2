-- A unique name's key is lowered, no longer case-folded (service/gallery/names.py: Strauß and
-- STRAUSS are two names). PostgreSQL's lower() depends on the database's collation, so the keys are
-- made again in Python right after this file, in the same transaction (postgres.py,
-- _lower_name_keys); old keys were unique, and lowering tells apart at least what folding did.
-- This file only records the step: its one statement reads and changes nothing.
SELECT 1;
