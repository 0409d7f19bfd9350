"""Checks of an annotation file against itself and against its images, run by every reader at the start.

The readers parse; these functions take what they parsed (a COCO file's `images` and `annotations`
lists, a list of (image file, declared width, declared height)) and report to a DatasetProblems log,
so that training (strict: the first error raises, naming the file and the item) and the dataset
checker (collecting: every one listed) apply one policy, written as a table in docs/datasets.md:

- two images with one id, or two annotations with one id: an error (pycocotools would keep the later
  one and hand the first one's boxes to it, or lose a box and double another);
- an optional field left out (`iscrowd`, `area`): read as its default, said in one line;
- an image whose file is another size than its annotation says: a warning naming both sizes; the
  boxes are read as pixels of the file (the size field is what is wrong: boxes are drawn on the image
  a tool shows), and the record takes the file's size, so image and boxes are scaled alike.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import imagesize
from loguru import logger

from yolox_fast.data.datasets.problems import WARNING, DatasetProblems
from yolox_fast.data.image_io import HEADER_THREADS, header_sizes

HEADER_CHUNK = 256  # headers a thread reads per task: one task per header costs as much as the header


def repeated(values: Sequence) -> dict:
    """{value: how many times} of the values that occur more than once, in first-seen order."""
    counts = Counter(values)
    return {v: n for v, n in counts.items() if n > 1}


def check_coco_ids(
    images: list[dict], annotations: list[dict], where: str, problems: DatasetProblems
) -> None:
    """Duplicate image ids (naming their files) and duplicate annotation ids (naming their images) of a
    COCO file `where`: errors."""
    for img_id, n in repeated([img.get("id") for img in images]).items():
        files = [str(img.get("file_name")) for img in images if img.get("id") == img_id]
        problems.error(
            "duplicate image id",
            f"{where}: image id {img_id} is given to {n} images ({', '.join(files[:3])}): their boxes would "
            "be mixed on one of them and the others never read",
        )
    for ann_id, n in repeated([ann.get("id") for ann in annotations]).items():
        owners = [str(ann.get("image_id")) for ann in annotations if ann.get("id") == ann_id]
        problems.error(
            "duplicate annotation id",
            f"{where}: annotation id {ann_id} is given to {n} annotations (of image ids "
            f"{', '.join(owners[:3])}): one box would be lost and another doubled",
        )


def fill_coco_defaults(annotations: list[dict], where: str, problems: DatasetProblems) -> None:
    """Give annotations without the optional `iscrowd` 0 and without `area` their box's area (what
    pycocotools and COCOeval read), in place; one line says how many and the first."""
    for field in ("iscrowd", "area"):
        lacking = [a for a in annotations if field not in a]
        if not lacking:
            continue
        for ann in lacking:
            if field == "iscrowd":
                ann["iscrowd"] = 0
            else:
                bbox = ann.get("bbox")
                ann["area"] = float(bbox[2] * bbox[3]) if _is_box(bbox) else 0.0
        default = "0" if field == "iscrowd" else "its box's area"
        message = (
            f"{where}: {len(lacking)} annotations have no `{field}` (first: annotation id "
            f"{lacking[0].get('id')}): read as {default}"
        )
        logger.info(message)
        problems.note(f"annotation without `{field}`", message, WARNING)


def _is_box(bbox) -> bool:
    return isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)


def differs(declared: tuple[int, int], upright: tuple[int, int], stored: tuple[int, int]) -> bool:
    """Whether an annotation's (h, w) is neither the image's size as decoded (`upright`, EXIF orientation
    applied) nor as stored (LabelImg annotates sideways photos as stored; the dataset reads those so)."""
    return tuple(declared) not in (tuple(upright), tuple(stored))


def read_header(
    path: str, declared: tuple[int, int] | None = None
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """`image_io.header_sizes` of `path`, None if it is missing or unreadable (the dataset says so where
    it reads the image). Where the stored size is the `declared` (h, w) that settles it, read by
    imagesize alone (11 us a JPEG here, against 49 us for Pillow's EXIF-aware header: what a COCO-sized
    set pays at every start)."""
    if declared is not None:
        try:
            width, height = imagesize.get(path)
        except (OSError, ValueError):
            width = height = -1
        if (height, width) == tuple(declared):
            return declared, declared
    try:
        return header_sizes(path)
    except (OSError, ValueError):
        return None


def fitted_size(
    file: str,
    width: int | None,
    height: int | None,
    header: tuple[tuple[int, int], tuple[int, int]] | None,
    where: str,
    problems: DatasetProblems,
) -> tuple[tuple[int, int] | None, str | None]:
    """(the (h, w) to read `file` at, the mismatch message or None) given the annotation's size and the
    file's `header` (`read_header`).

    The declared size where the header agrees or cannot be read (the damage is found where the image is
    read); the file's size where the annotation gives none, or another (noted as a warning naming both).
    None where neither is known.
    """
    declared = (int(height), int(width)) if width and height else None
    if header is None:
        return declared, None
    upright, stored = header
    if declared is not None and not differs(declared, upright, stored):
        return declared, None
    if declared is None:
        return upright, None
    message = (
        f"{file}: the file is {upright[1]}x{upright[0]}, {where} says {declared[1]}x{declared[0]}; its boxes "
        "are read as pixels of the file"
    )
    problems.note("image size differs from its annotation", message)
    return upright, message


def report_size_mismatches(messages: list[str], problems: DatasetProblems) -> None:
    """One warning line for training (the checker lists each through `problems`)."""
    if messages and not problems.collect:
        logger.warning(
            f"{len(messages)} images differ in size from what their annotation says (first: {messages[0]}); "
            "see docs/datasets.md, 'Damaged and inconsistent data'"
        )


def file_sizes(
    entries: Sequence[tuple[str, int | None, int | None]], where: str, problems: DatasetProblems
) -> list[tuple[int, int] | None]:
    """`fitted_size` of every (file, declared width, declared height) of `entries`, headers read in
    parallel, mismatches said in one line."""
    jobs = [(file, (int(h), int(w)) if w and h else None) for file, w, h in entries]
    chunks = [jobs[i : i + HEADER_CHUNK] for i in range(0, len(jobs), HEADER_CHUNK)]
    with ThreadPoolExecutor(HEADER_THREADS) as pool:
        headers = [h for chunk in pool.map(lambda c: [read_header(*job) for job in c], chunks) for h in chunk]
    sizes, mismatched = [], []
    for (file, width, height), header in zip(entries, headers):
        size, message = fitted_size(file, width, height, header, where, problems)
        sizes.append(size)
        if message:
            mismatched.append(message)
    report_size_mismatches(mismatched, problems)
    return sizes


def check_shared_images(
    files: Sequence[str], owners: Sequence[str], what: str, problems: DatasetProblems
) -> None:
    """Errors for image files that more than one annotation file (`owners[i]` of `files[i]`) claims: `what`
    names the kind of owner ("VOC annotation")."""
    claims = defaultdict(list)
    for file, owner in zip(files, owners):
        claims[file].append(owner)
    for file, n in repeated(list(files)).items():
        problems.error(
            "image shared by annotations",
            f"{file} is the image of {n} {what}s ({', '.join(claims[file][:3])}): its boxes would be split "
            "over copies of it",
        )
