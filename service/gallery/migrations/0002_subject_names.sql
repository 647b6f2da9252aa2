-- A subject created with a unique name (a CompreFace subject, a DeepStack userid) holds its name's
-- key (service/gallery/names.py), which no other subject holds. Those the compatible APIs made
-- before, whose id is their name, take theirs; where only case told two apart, the oldest does.
-- lower() under COLLATE "C" changes ASCII letters only, as the key does for an id's characters.
ALTER TABLE subjects ADD COLUMN name_key TEXT;
UPDATE subjects SET name_key = lower(id COLLATE "C")
WHERE id IN (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY lower(id COLLATE "C") ORDER BY created, id) AS n FROM subjects WHERE id = name
    ) ranked
    WHERE n = 1
);
CREATE UNIQUE INDEX subjects_name_key ON subjects (name_key);
