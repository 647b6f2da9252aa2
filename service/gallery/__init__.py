"""The gallery: enrolled subjects and faces (`store`), searched through a vector index (`index`)."""
