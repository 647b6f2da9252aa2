-- A merge of two subjects (POST /subjects/{id}/merge, CompreFace's rename onto a taken name) is
-- logged as one `move` change: every replica's open-set roster re-reads the faces' subject, and the
-- index (a shared Milvus one too) keeps their vectors, whose ids do not change.
ALTER TABLE changes DROP CONSTRAINT IF EXISTS changes_op_check;
ALTER TABLE changes ADD CONSTRAINT changes_op_check CHECK (op IN ('add', 'remove', 'move'));
