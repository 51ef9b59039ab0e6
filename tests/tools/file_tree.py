"""Writes a small tree of files for the tools' tests."""
import os


def write_tree(root, files):
    """Writes files ({path relative to root: text, or None for a folder}) under root."""
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(path if text is None else os.path.dirname(path), exist_ok=True)
        if text is not None:
            with open(path, "w") as f:
                f.write(text)
