-- Collections (service/gallery/collections.py): every subject, face and change belongs to one, and a
-- subject's id and unique name are unique within it. Every existing row moves into `default`; the
-- columns then keep no default, so no write can land in a collection it did not name.
ALTER TABLE subjects ADD COLUMN collection TEXT NOT NULL DEFAULT 'default';
ALTER TABLE faces ADD COLUMN collection TEXT NOT NULL DEFAULT 'default';
ALTER TABLE changes ADD COLUMN collection TEXT NOT NULL DEFAULT 'default';
ALTER TABLE subjects ALTER COLUMN collection DROP DEFAULT;
ALTER TABLE faces ALTER COLUMN collection DROP DEFAULT;
ALTER TABLE changes ALTER COLUMN collection DROP DEFAULT;
ALTER TABLE faces DROP CONSTRAINT faces_subject_id_fkey;
ALTER TABLE subjects DROP CONSTRAINT subjects_pkey;
ALTER TABLE subjects ADD PRIMARY KEY (collection, id);
ALTER TABLE faces ADD FOREIGN KEY (collection, subject_id) REFERENCES subjects (collection, id) ON DELETE CASCADE;
DROP INDEX subjects_name_key;
CREATE UNIQUE INDEX subjects_name_key ON subjects (collection, name_key);
DROP INDEX subjects_created;
CREATE INDEX subjects_created ON subjects (collection, created, id);
DROP INDEX faces_subject;
CREATE INDEX faces_subject ON faces (collection, subject_id);
CREATE INDEX faces_collection ON faces (collection, model_sha256);
