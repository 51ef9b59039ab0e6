"""Reads the CSV files qattn writes (a run's metrics.csv and diag.csv, a
sweep's summary.csv) for tools/plot.py, gap_table.py and diag_table.py. A file
that is missing, a directory, empty, has a header without a column the tool
needs, a row with more or fewer cells than its header, or a cell that is not a
number raises CsvError naming the file, the line, the column and the value; the
tools print it in one line instead of a Python traceback."""
import csv
import os

METRICS_COLUMNS = ("step", "tokens", "train_loss", "val_loss", "event")
SUMMARY_COLUMNS = ("id", "setting", "status", "baseline")
DIAG_COLUMNS = ("step", "layer", "kind", "q_rms", "k_rms", "max_abs_score")


def label(row):
    """What a reader sees for a summary.csv row's cell: its label (`qattn sweep`
    writes one per setting), or its setting where the file has no label column."""
    return row.get("label") or row["setting"]


def md_cell(text):
    """text as a cell of a markdown table: a | in it escaped."""
    return text.replace("|", "\\|")


class CsvError(ValueError):
    """A CSV file that is not what qattn writes; str() names the file and what is wrong."""


def read_rows(path, required):
    """[(line number, row dict)] of the data rows of path, whose header must hold
    every column in required."""
    if not os.path.exists(path):
        raise CsvError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CsvError(f"{path}: is a directory; allowed: a CSV file")
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames
            if not header:
                raise CsvError(f"{path}: empty; allowed: a CSV file whose header has {', '.join(required)}")
            missing = [c for c in required if c not in header]
            if missing:
                raise CsvError(f"{path}: its header has no {', '.join(missing)}; allowed: the header qattn writes "
                               f"(with {', '.join(required)})")
            for row in reader:
                cells = len(header) - sum(v is None for v in row.values()) + len(row.get(None, []))
                if cells != len(header):
                    raise CsvError(f"{path}: line {reader.line_num}: {cells} cells, its header has {len(header)}; "
                                   "the file is cut short or damaged")
                rows.append((reader.line_num, row))
    except OSError as e:
        raise CsvError(f"{path}: cannot read: {e.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise CsvError(f"{path}: not a CSV file qattn writes ({e})") from None
    return rows


def number(path, line, row, column, kind=float, empty_ok=False):
    """One cell as kind (float or int; an int cell may be written as 100.0), or
    None for an empty cell where empty_ok."""
    text = (row.get(column) or "").strip()
    if empty_ok and not text:
        return None
    try:
        if kind is float:
            return float(text)
        if text.lstrip("-").isdigit():
            return int(text)
        x = float(text)
        if not x.is_integer():
            raise ValueError(text)
        return int(x)
    except ValueError:
        allowed = "an integer" if kind is int else "a number"
        raise CsvError(f"{path}: line {line}: {column} {text!r} is not allowed; "
                       f"allowed: {allowed}{' or empty' if empty_ok else ''}") from None
