"""A CompreFace subject or DeepStack userid is a subject's name: any printable text up to NAME_MAX
characters ("John Smith"), one subject whatever its case (`Tony_Blair` is `tony_blair`, as
CompreFace looks names up), answered back as given. facegate's subject ids stay as they are.

A subject made through these APIs holds its name (service/gallery/names.py); its id is the name
where that is a facegate id no other subject has, else a random one. A subject made through
facegate's own API holds no name these APIs see: they show and find it by its id, as they did
before names were mapped."""

from __future__ import annotations

import re
import unicodedata

from service.api.schemas import SUBJECT_ID_PATTERN
from service.core.errors import InvalidParameters, SubjectExists, SubjectNotFound
from service.gallery.interface import FaceRecord, GalleryStore, NewFace, Subject

NAME_MAX = 256  # characters: the longest name facegate's own API takes (SubjectIn.name)
CREATE_TRIES = 3  # a name taken, or its id, by a concurrent request: looked up and tried again


def checked(raw: str | None, field: str) -> str:
    """A name as given: not blank, at most NAME_MAX characters, no control characters (a lone
    surrogate, which no store can encode, included). Anything else is a 4xx in the API's shape."""
    if raw is None or not raw.strip():
        raise InvalidParameters(f"{field} is required")
    if len(raw) > NAME_MAX:
        raise InvalidParameters(f"{field} is {len(raw)} characters long; at most {NAME_MAX}")
    bad = next((c for c in raw if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise InvalidParameters(f"{field} holds a control character (U+{ord(bad):04X})")
    return raw


def label(subject: Subject) -> str:
    """What these APIs call a subject: its name where it holds one, else its id."""
    return subject.name if subject.unique_name else subject.id


def labels(gallery: GalleryStore, subject_ids: list[str]) -> dict[str, str]:
    """`label` of each of `subject_ids`, in one lookup (a subject deleted meanwhile keeps its id)."""
    named = gallery.unique_names(list(dict.fromkeys(subject_ids)))
    return {i: named.get(i, i) for i in subject_ids}


def find(gallery: GalleryStore, name: str) -> Subject | None:
    """The subject `name` stands for: the one holding it, whatever its case; else one of facegate's
    own API whose id it is exactly."""
    try:
        return gallery.subject_by_name(name)
    except SubjectNotFound:
        pass
    if not re.fullmatch(SUBJECT_ID_PATTERN, name):
        return None
    try:
        subject = gallery.get_subject(name)
    except SubjectNotFound:
        return None
    return None if subject.unique_name else subject  # one holding a name is found by that name only


def ensure(gallery: GalleryStore, name: str) -> tuple[Subject, bool]:
    """The subject `name` stands for, made when there is none (holding the name, as CompreFace
    creates a subject on its first face); whether it was made now. Requests making one name at
    once make one subject: the unique key decides, and the others find it."""
    subject_id = name if re.fullmatch(SUBJECT_ID_PATTERN, name) else None
    attempts = 0
    while True:
        found = find(gallery, name)
        if found is not None:
            return found, False
        try:
            return gallery.create_subject(name, {}, subject_id=subject_id, unique_name=True), True
        except SubjectExists:
            attempts += 1
            if attempts == CREATE_TRIES:
                raise
            subject_id = None  # the id may be another subject's (one renamed away from it): a random one next


def add_faces(gallery: GalleryStore, name: str, faces: list[NewFace]) -> tuple[list[FaceRecord], bool]:
    """`faces` added to the subject `name` stands for, made when there is none; whether it was made
    now. A subject deleted between the two steps is made again."""
    subject, made = ensure(gallery, name)
    try:
        return gallery.add_faces(subject.id, faces), made
    except SubjectNotFound:
        subject, made = ensure(gallery, name)
        return gallery.add_faces(subject.id, faces), made
