"""The declared pyspark floor (4.0): the source must import and work without Spark 4.2's admission API.

Checked here without a Spark session, in a subprocess where the newer names cannot be imported,
as on 4.0: ``pyspark.sql.streaming.datasource`` (4.2) and ``DataSourceStreamArrowWriter``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.spark

SCRIPT = textwrap.dedent(
    """
    import sys
    import pyarrow as pa
    import pyspark.sql.datasource as ds
    from pyspark.sql import Row

    sys.modules["pyspark.sql.streaming.datasource"] = None  # ImportError, as before Spark 4.2
    del ds.DataSourceStreamArrowWriter
    from qjm.spark import compat
    from qjm.spark.options import ReadOptions
    from qjm.spark.sink import QJMStreamWriter
    from qjm.spark.source import QJMDataSource, QJMStreamReader

    assert not compat.NATIVE and not compat.ARROW_STREAM_WRITER
    assert QJMStreamWriter.__mro__[1] is ds.DataSourceStreamWriter
    r = QJMStreamReader(ReadOptions.parse({"uri": "qjournal://127.0.0.1:1;127.0.0.1:2;127.0.0.1:3/j",
                                           "maxRecordsPerTrigger": "7"}))
    assert r.getDefaultReadLimit() == compat.ReadMaxRows(7)
    assert QJMDataSource.name() == "qjm"
    (b,) = compat.arrow_batches(iter([Row(record=b"a"), Row(record=b"b")]))
    assert b.column(0).to_pylist() == [b"a", b"b"] and b.schema.field(0).type == pa.binary()
    print("imported")
    """
)


def test_source_imports_without_the_admission_api() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "imported"
