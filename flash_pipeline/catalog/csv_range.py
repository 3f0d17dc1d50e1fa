"""The dates and timestamps a CSV file gives back: Arrow's CSV writer writes any value, but its reader parses
years 0000-9999 only (``-1199-02-15``, ``10000-01-01`` are "invalid value"), and not the nanosecond timestamps next
to int64's minimum. A CSV compacted file holding one was committed and then unreadable by every command.

The readable values form one range per type, so a column's minimum and maximum decide: both are written and
parsed back in the column's type (a two-row CSV), before the file is written."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from flash_pipeline.errors import FlashError


def _temporal(t: pa.DataType) -> pa.DataType | None:
    """The date or timestamp type a column's values have (a dictionary's values), or None."""
    if pa.types.is_dictionary(t):
        return _temporal(t.value_type)
    return t if pa.types.is_timestamp(t) or pa.types.is_date(t) else None


def require_csv_readable(table: pa.Table, where: str = "the table") -> None:
    """Raise the one-line FlashError naming a date or timestamp column whose extreme value a CSV file cannot give
    back (the file is not written)."""
    for i, f in enumerate(table.schema):
        t = _temporal(f.type)
        column = table.column(i)
        if t is None or column.null_count == len(column):
            continue
        values = column.cast(t) if pa.types.is_dictionary(f.type) else column
        lo, hi = pc.min_max(values).values()
        extremes = pa.table({"x": pa.array([lo, hi], type=t)})
        sink = io.BytesIO()
        pacsv.write_csv(extremes, sink)
        try:
            options = pacsv.ConvertOptions(column_types={"x": t})
            back = pacsv.read_csv(io.BytesIO(sink.getvalue()), convert_options=options)
            ok = back.column("x").equals(extremes.column("x"))
        except pa.ArrowInvalid:
            ok = False
        if not ok:
            text = sink.getvalue().decode().splitlines()[1:]
            raise FlashError(f"column {f.name!r} ({f.type}) of {where} holds {' / '.join(text)}, beyond what CSV files "
                             "give back (years 0000-9999): compact with --format parquet or feather")
