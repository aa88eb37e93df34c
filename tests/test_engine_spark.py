"""Spark: the engine contract on a local SparkSession, and one run on a real standalone cluster.

Every test of the engine contract (tests/test_engine_contract.py) that takes an engine maker
runs here on Spark: the same bounded query and secret key must give *identical* exact
aggregates to DuckDB's. The Spark-only tests add the pitfalls of the issue: sums past 2^63
(Spark's SUM of BIGINT overflows), the portable keyed hash (the same kept rows as DuckDB for
the same key), timestamp and boolean keys, the caller's ANSI setting, and a query run by a
master and two workers started on loopback.

One local SparkSession (one JVM) serves the whole run: the module is one xdist group
(``--dist loadgroup`` sends it to one worker), and the JVM is ended with the session, as is
every process the cluster test starts (also if the run is killed: a watchdog).
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

import dpcurator as dp
import test_engine_contract as contract
from dpcurator.engines import Engine
from dpcurator.engines.spark import SparkEngine
from dpcurator.errors import InternalError, UserError
from dpcurator.query import GroupKey
from dpcurator.query.bounding import BoundedQuery, MeasureSpec, ValueSpec

pytestmark = [
    pytest.mark.xdist_group("spark"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]

_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # short runs on two cores: half the time
_CONF = {  # small data: one shuffle partition, interpreted (compiling code costs more)
    "spark.driver.extraJavaOptions": _JVM,
    "spark.executor.extraJavaOptions": _JVM,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "1g",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def _stop_jvm(spark: Any) -> None:
    """Stop the session and end its JVM (pyspark otherwise keeps it until Python exits)."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.stdin.close()  # the JVM exits when its stdin closes
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        SparkContext._gateway = None
        SparkContext._jvm = None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's one local SparkSession (two cores, no UI)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("dpcurator-tests")
    for key, value in _CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("OFF")  # refused queries are the tests' own
    yield session
    _stop_jvm(session)


def spark_frame(spark: Any, df: pd.DataFrame) -> Any:
    """The DataFrame's values as Spark's, the same as DuckDB reads (NaN kept in float
    columns, NULL elsewhere; naive timestamps as TIMESTAMP_NTZ), from Arrow (no Python
    worker reads it)."""
    from pyspark.sql import types as T

    table = contract.arrow(df)
    spark_types = {"int64": T.LongType(), "double": T.DoubleType(), "string": T.StringType(),
                   "date32[day]": T.DateType(), "bool": T.BooleanType(), "null": T.StringType(),
                   "timestamp[us]": T.TimestampNTZType()}
    schema = T.StructType([T.StructField(f.name, spark_types[str(f.type)], True)
                           for f in table.schema])
    return spark.createDataFrame(table, schema=schema)


@pytest.fixture
def make(spark: Any) -> Iterator[contract.Make]:
    """The contract's engine maker: a Spark engine on the DataFrame's rows."""
    engines: list[SparkEngine] = []

    def build(df: pd.DataFrame) -> Engine:
        engine = SparkEngine(spark_frame(spark, df))
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close()


# Every test of the engine contract that takes an engine maker, run here with Spark's.
for _name, _test in vars(contract).items():
    if _name.startswith("test_") and "make" in inspect.signature(_test).parameters:
        globals()[_name] = _test


# -- Spark's pitfalls -----------------------------------------------------------------------


def test_exact_sums_pass_2_to_the_63(make: contract.Make) -> None:
    """Spark's SUM of BIGINT overflows past 2^63, where DuckDB's is a HUGEINT: the engine
    sums DECIMAL(38,0), so 6,000 units at nearly 2^51 each still add up exactly."""
    units = 6_000
    df = pd.DataFrame({"uid": np.arange(units), "g": ["a"] * units,
                       "v": np.full(units, 100.0)})
    spec = ValueSpec("v", 0.0, 100.0, 0.0, float(2**44))
    q = BoundedQuery("uid", (GroupKey("g", '"g"'),), None, None, 1, 1, "rescale", "rescale",
                     (MeasureSpec("sum", "values", spec), MeasureSpec("rows", "rows")))
    result = contract.same_on(make, df, q)
    assert result.measures["sum"] == [units * 100 * 2**44] and units * 100 * 2**44 > 2**63


def test_the_same_key_keeps_the_same_rows_as_duckdb(make: contract.Make) -> None:
    """One partition per unit and one kept row in it: each partition's sum names the row
    kept, and Spark keeps the very row DuckDB keeps (the portable keyed hash); another key
    keeps other rows."""
    rng = np.random.default_rng(3)
    rows = 1_200
    df = pd.DataFrame({"uid": rng.integers(0, 100, rows), "v": rng.permutation(rows) / 16})
    df["g"] = "u" + df["uid"].astype(str)
    spec = ValueSpec("v", 0.0, 100.0, 0.0, 16.0)
    q = BoundedQuery("uid", (GroupKey("g", '"g"'),), None, None, 1, 1, "sample", "sample",
                     (MeasureSpec("sum", "values", spec),), selection_units=True)
    first = contract.as_table(contract.same_on(make, df, q, key=41))
    other = contract.as_table(contract.same_on(make, df, q, key=42))
    assert first != other


def test_timestamp_boolean_and_decimal_columns(make: contract.Make) -> None:
    """Timestamp (TIMESTAMP_NTZ) and boolean keys hash as DuckDB's TIMESTAMP and BOOLEAN."""
    rng = np.random.default_rng(8)
    rows = 500
    start = datetime.datetime(1969, 12, 30, 23, 59, 59, 250_000)
    df = pd.DataFrame({
        "uid": rng.integers(0, 40, rows),
        "ts": [start + datetime.timedelta(hours=int(h), microseconds=int(us))
               for h, us in zip(rng.integers(0, 5, rows), rng.integers(0, 3, rows),
                                strict=True)],
        "b": rng.random(rows) < 0.5,
        "v": rng.normal(10, 5, rows),
    })
    for key in (GroupKey("ts", '"ts"'), GroupKey("b", '"b"')):
        for modes in contract.MODES:
            contract.same_on(make, df, contract.bounded(contract.SHAPES["variances"], modes,
                                                        (key,), k=1))


def test_the_callers_ansi_setting_changes_nothing(spark: Any) -> None:
    """The engine's statements run in a session of their own with ANSI off: the caller's
    session keeps its setting, and hostile values (overflow, division by zero, bad casts)
    fail no query and give the same answer under either. A failing operation is NULL, as on
    every engine (engines._total): rows 3 and 4 overflow in "i" * "i", divide by zero and
    cast text that is no INTEGER, so their filter is NULL, as is row 1's (0 * 0 > 0 is
    false, the rest NULL); the other five rows pass."""
    frame = spark_frame(spark, contract.HOSTILE)
    q = BoundedQuery("uid", (), '"i" * "i" > 0 OR "f" / 0 > 1 OR CAST("t" AS INTEGER) > 1',
                     None, 1, 1, "rescale", "none", (MeasureSpec("rows", "rows"),))
    before = spark.conf.get("spark.sql.ansi.enabled")
    try:
        for ansi in ("true", "false"):
            spark.conf.set("spark.sql.ansi.enabled", ansi)
            engine = SparkEngine(frame)
            assert engine.compute_exact_aggregates(q, key=1).measures == {"rows": [5]}
            assert spark.conf.get("spark.sql.ansi.enabled") == ansi
            engine.close()
    finally:
        spark.conf.set("spark.sql.ansi.enabled", before)


def test_a_pattern_read_from_the_data_is_refused_before_anything_runs(spark: Any) -> None:
    engine = SparkEngine(spark_frame(spark, contract.HOSTILE))
    q = BoundedQuery("uid", (), '"t" LIKE "t"', None, 1, 1, "rescale", "none",
                     (MeasureSpec("rows", "rows"),))
    with pytest.raises(UserError, match="literal pattern"):
        engine.validate(q)
    q = BoundedQuery("uid", (), '"d" + "t" > 1', None, 1, 1, "rescale", "none",
                     (MeasureSpec("rows", "rows"),))
    with pytest.raises(UserError, match="column types"):
        engine.validate(q)
    engine.close()


def _neighbours(spark: Any, codes: tuple[str, str], sql: str
                ) -> list[tuple[str, float, str]]:
    """One query on two neighbouring DataFrames (unit 5's code is ``codes[0]`` or
    ``codes[1]``): per neighbour, "released" or "refused", the budget spent, the message."""
    out = []
    for code in codes:
        df = pd.DataFrame({"uid": np.arange(40), "code": ["ab", "a\\b", "%", "x"] * 10})
        df.loc[5, "code"] = code
        curator = dp.Curator.from_spark(spark_frame(spark, df), privacy_unit="uid",
                                        budget=dp.PureDP(10.0), cache=False)
        try:
            curator.sql(sql, epsilon=1.0)
            outcome, message = "released", ""
        except UserError as exc:
            outcome, message = "refused", str(exc)
        finally:
            spent = 10.0 - curator.remaining.epsilon
            curator.close()
        out.append((outcome, spent, message))
    return out


@pytest.mark.parametrize("pattern", ["(a|b)*c", "("])
def test_a_regular_expression_is_refused_before_the_charge_on_both_neighbours(
        spark: Any, pattern: str) -> None:
    """a bug hunt: ``regexp_matches(code, '(a|b)*c')`` was released where unit 5's code was
    'ab', and with 'ab' * 50,000 Java's backtracking overflowed the executor's stack and shut
    the SparkContext down after the charge (a one-bit leak, and every later query failed);
    the malformed '(' failed after the charge on every dataset, a raw Py4JJavaError with
    Spark's text. Both neighbours are now refused, nothing charged, and the session serves
    the next query."""
    sql = f"SELECT COUNT(*) AS n FROM data WHERE regexp_matches(code, '{pattern}')"
    outcomes = _neighbours(spark, ("ab", "ab" * 50_000), sql)
    for outcome, spent, message in outcomes:
        assert (outcome, spent) == ("refused", 0.0)
        assert "LIKE" in message and "Exception" not in message and "ab" not in message
    assert [o for o, _, _ in _neighbours(spark, ("ab", "ab" * 50_000),
                                         "SELECT COUNT(*) AS n FROM data WHERE code LIKE "
                                         "'%a_b%'")] == ["released", "released"]


@pytest.mark.parametrize("pattern", ["\\a", "a\\%", "%\\\\%", "\\_"])
def test_a_backslash_in_like_is_an_ordinary_character_as_on_duckdb(
        make: contract.Make, spark: Any, pattern: str) -> None:
    """a bug hunt: Spark's LIKE escapes with a backslash, and ``LIKE '\\a'`` (an escape before
    an ordinary character) failed after the charge on every dataset (the budget lost). A
    backslash is now an ordinary character, as in DuckDB's LIKE: both neighbours are
    released, and the exact counts are DuckDB's."""
    df = pd.DataFrame({"uid": np.arange(8), "code": ["\\a", "a", "a\\", "a\\x", "%", "\\%",
                                                     "\\_", "_"]})
    for where in (f"\"code\" LIKE '{pattern}'", f"\"code\" ILIKE '{pattern.upper()}'"):
        q = BoundedQuery("uid", (), where, None, 1, 1, "rescale", "none",
                         (MeasureSpec("rows", "rows"),))
        contract.same_on(make, df, q)
    sql = f"SELECT COUNT(*) AS n FROM data WHERE code LIKE '{pattern}'"
    outcomes = _neighbours(spark, ("\\a", "b"), sql)
    assert [(o, spent) for o, spent, _ in outcomes] == [("released", 1.0)] * 2


def test_text_cast_checks_run_on_long_values(spark: Any) -> None:
    """The casts' own regular expressions (engines._total: a sign and digits, a decimal
    number) repeat character classes only, which Java matches without recursing per
    character: a 400,000-character value is released on both neighbours."""
    sql = ("SELECT COUNT(*) AS n FROM data WHERE CAST(code AS INTEGER) > 0 OR "
           "CAST(code AS DOUBLE) > 0")
    outcomes = _neighbours(spark, ("1", " " * 200_000 + "1" + " " * 200_000), sql)
    assert [(o, spent) for o, spent, _ in outcomes] == [("released", 1.0)] * 2


def test_an_error_while_a_job_runs_is_the_engines_own_without_sparks_text(
        spark: Any, tmp_path: Path) -> None:
    """a bug hunt: an error raised while a Spark job runs arrives as py4j's Py4JJavaError,
    which the engine did not map: it escaped with Spark's whole error text, which can quote a
    record. Here a DataFrame whose reading fails (a FAILFAST CSV reader, a malformed record):
    the engine's own errors, with no text of Spark's."""
    path = tmp_path / "rows.csv"
    path.write_text("1,5,0.5\n2,secret_value_42,secret_value_43\n")
    frame = spark.read.schema("uid BIGINT, v BIGINT, w DOUBLE").option(
        "mode", "FAILFAST").csv(str(path))
    engine = SparkEngine(frame)
    q = BoundedQuery("uid", (), '"v" > 1', None, 1, 1, "rescale", "none",
                     (MeasureSpec("rows", "rows"),))
    assert engine.validate(q)  # analysed: no row is read
    with pytest.raises(InternalError) as failed:
        engine.compute_exact_aggregates(q, key=1)
    with pytest.raises(UserError) as refused:
        engine.nan_columns(["w"])
    for info in (failed, refused):
        message = str(info.value)
        assert "secret" not in message and "SparkException" not in message
        assert info.value.__suppress_context__ and info.value.__cause__ is None
    engine.close()


def test_columns_are_named_as_duckdb_names_them(spark: Any) -> None:
    frame = spark.sql("SELECT 1 AS a, CAST(1 AS INT) AS b, 'x' AS c, 1.5D AS d, "
                      "CAST(1.5 AS DECIMAL(10,2)) AS e, DATE'2024-01-01' AS f, "
                      "TIMESTAMP_NTZ'2024-01-01 00:00:00' AS g, true AS h, "
                      "TIMESTAMP'2024-01-01 00:00:00' AS i")
    assert SparkEngine(frame).columns() == {
        "a": "INTEGER", "b": "INTEGER", "c": "VARCHAR", "d": "DOUBLE", "e": "DECIMAL(10,2)",
        "f": "DATE", "g": "TIMESTAMP_NTZ", "h": "BOOLEAN", "i": "TIMESTAMP WITH TIME ZONE"}


def test_the_curator_on_spark_releases_what_the_curator_on_duckdb_releases(
        spark: Any) -> None:
    """Same data, same seeded noise source: the same exact aggregates, so the same release;
    ``Curator.from_spark`` takes the DataFrame itself."""
    df = contract.contract_frame(9)
    sql = ("SELECT g, COUNT(*) AS n, SUM(v) AS s, AVG(w) AS m, VARIANCE(w) AS var, "
           "COUNT(DISTINCT uid) AS u FROM data GROUP BY g")
    options: dict[str, Any] = dict(
        privacy_unit="uid", budget=dp.ApproxDP(50.0, 1e-5), bounds={"v": (0, 100), "w": (0, 40)},
        max_partitions=2, max_rows_per_partition=3, check_nan=False)
    releases = []
    for curator in (dp.Curator(contract.duckdb_engine(df), source=dp.noise.SeededRandom(5),
                               **options),
                    dp.Curator.from_spark(spark_frame(spark, df),
                                          source=dp.noise.SeededRandom(5), **options)):
        # epsilon 20: every partition (about 27 units after the cap) passes the selection
        releases.append(curator.sql(sql, epsilon=20.0, delta=1e-6))
        curator.close()
    assert releases[0].keys == releases[1].keys and releases[0].keys
    for name in releases[0].values:
        assert np.array_equal(releases[0].values[name], releases[1].values[name],
                              equal_nan=True), name


def test_spark_queries_are_refused_free_or_answered_at_their_cost(spark: Any) -> None:
    """The one-path property (tests/test_one_path.py) on Spark: 20 drawn queries, each refused
    with the ledger untouched or answered with exactly its stated cost charged."""
    import test_one_path as one_path

    curator = dp.Curator.from_spark(spark_frame(spark, one_path.frame()), privacy_unit="uid",
                                    budget=dp.ApproxDP(1e12, 1e-3), cache=False,
                                    source=dp.noise.SeededRandom(3))
    try:
        for sql, options in one_path.sample_queries(20, 3):
            if "rho" in options:  # this budget is (epsilon, delta): ask it that way
                options = {**options, "rho": None, "epsilon": 1.0}
                options.pop("rho")
            one_path.refused_free_or_answered_at_its_cost(curator, sql, options)
    finally:
        curator.close()


# -- a real cluster: a master and two workers on loopback ---------------------------------------

_CLUSTER_ROWS = ("SELECT id % 211 AS uid, CAST(id % 7 AS STRING) AS g, "
                 "CAST(id % 13 AS DOUBLE) * 1.5 AS v FROM range(0, 24000, 1, 6)")
_CLUSTER_QUERY = BoundedQuery(
    "uid", (GroupKey("g", '"g"'),), '"v" > 1', None, 2, 3, "sample", "sample",
    (MeasureSpec("rows", "rows"), MeasureSpec("units", "units"),
     MeasureSpec("sum", "values", ValueSpec("v", 0.0, 20.0, 0.0, 8.0))),
    selection_units=True)

# Run as ``python -c DRIVER MASTER_URL SETTINGS ROWS_SQL QUERY`` (settings as JSON, the query
# pickled in hex): waits for both executors, runs the query on the cluster, then again in
# local mode in the same JVM, and prints both answers and each executor's completed tasks.
_DRIVER = r"""
import json, pickle, sys, time
from pyspark.sql import SparkSession
from dpcurator.engines.spark import SparkEngine
master, settings, rows, query = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], \
    pickle.loads(bytes.fromhex(sys.argv[4]))

def session(master):
    builder = SparkSession.builder.master(master).appName("dpcurator-cluster-test")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark

def answer(spark):
    r = SparkEngine(spark.sql(rows)).compute_exact_aggregates(query, key=77)
    return {json.dumps(list(k)): [r.measures[m][i] for m in sorted(r.measures)]
            + [r.selection_units[i]] for i, k in enumerate(r.keys)}

spark = session(master)
sc = spark.sparkContext._jsc.sc()
deadline = time.monotonic() + 120
while sc.getExecutorMemoryStatus().size() < 3:  # the driver and two executors
    if time.monotonic() > deadline:
        sys.exit("the two executors did not register")
    time.sleep(0.1)
cluster = answer(spark)
executors = sc.statusStore().executorList(True)
tasks = {executors.apply(i).id(): executors.apply(i).completedTasks()
         for i in range(executors.size())}
spark.stop()
local = answer(session("local[2]"))
print(json.dumps({"cluster": cluster, "local": local, "tasks": tasks}))
"""

# Run as ``python -c WATCHDOG OWNER_PID FOLDER PGID...``: ends the cluster's process groups
# if the test's process dies before it does (standard library only).
_WATCHDOG = r"""
import os, signal, sys, time
owner, folder, groups = int(sys.argv[1]), sys.argv[2], [int(g) for g in sys.argv[3:]]
while os.path.isdir(folder):
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        break
    time.sleep(0.5)
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{log.name}: no {text!r}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def _end(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group (a worker's executors are in its group), then SIGKILL."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # executors that outlived their worker
        process.wait()


@pytest.mark.xdist_group("spark-cluster")  # a JVM of its own: runs beside the local tests
def test_a_standalone_cluster_gives_local_modes_answer() -> None:
    """A master and two one-core workers on loopback, and a driver of their own: the plan
    runs distributed (both executors complete tasks, each launched by its own worker) and
    gives exactly the aggregates of local mode."""
    from pyspark.find_spark_home import _find_spark_home

    home = _find_spark_home()
    folder = Path(tempfile.mkdtemp(prefix="dpcurator-spark-"))
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_DAEMON_MEMORY": "256m", "SPARK_DAEMON_JAVA_OPTS": _JVM,
           "PYSPARK_PYTHON": sys.executable}
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *command: str) -> subprocess.Popen[bytes]:
        with open(folder / f"{name}.log", "wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        processes.append(process)
        return process

    spark_class = str(Path(home) / "bin" / "spark-class")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    settings = {**_CONF, "spark.sql.shuffle.partitions": "2", "spark.executor.memory": "512m",
                "spark.executor.cores": "1", "spark.cores.max": "2",
                "spark.driver.memory": "512m"}
    try:
        master = start("master", spark_class, "org.apache.spark.deploy.master.Master",
                       "--host", "127.0.0.1", "--port", str(port), "--webui-port", "0")
        _wait_for(folder / "master.log", "I have been elected leader", master, 90)
        for i in (1, 2):
            start(f"worker{i}", spark_class, "org.apache.spark.deploy.worker.Worker",
                  "--host", "127.0.0.1", "--cores", "1", "--memory", "768m", "--webui-port",
                  "0", "--work-dir", str(folder / f"work{i}"), url)
        driver = start("driver", sys.executable, "-c", _DRIVER, url, json.dumps(settings),
                       _CLUSTER_ROWS, pickle.dumps(_CLUSTER_QUERY).hex())
        subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(folder),
                          *(str(p.pid) for p in processes)], stdin=subprocess.DEVNULL,
                         start_new_session=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            driver.wait(timeout=240)
        output = (folder / "driver.log").read_text(errors="replace")
        assert driver.returncode == 0, output[-3000:]
        answer = json.loads(output.strip().splitlines()[-1])
        assert answer["cluster"] == answer["local"] and answer["local"]
        executors = {k: v for k, v in answer["tasks"].items() if k != "driver"}
        assert len(executors) == 2 and all(done > 0 for done in executors.values()), answer
        for i in (1, 2):  # each worker launched one of the app's executors
            assert len(list((folder / f"work{i}").glob("app-*/*"))) == 1
    finally:
        _end(processes)
        shutil.rmtree(folder, ignore_errors=True)


def test_join_shapes_give_identical_exact_aggregates_on_spark(spark: Any) -> None:
    """The contract's join shapes (tests/test_engine_contract.py): a schema of Spark
    DataFrames, joined by Spark, bounded after the join exactly as DuckDB does."""
    import test_joins as joins

    data = joins.tables(5)
    frames = {name: spark_frame(spark, frame) for name, frame in data.items()}
    with pytest.warns(UserWarning, match="reach no unit"):
        on_spark = dp.Curator.from_spark(frames, privacy_unit=joins.UNITS,
                                         public=["nation"], budget=dp.PureDP(10), cache=False)
    contract.schema_exact({"duckdb": joins.schema_curator(data), "spark": on_spark})
    on_spark.close()
