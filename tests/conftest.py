"""Fixtures shared by every test folder: moto's S3 server, a bucket per test, a fault-injecting proxy;
Azurite (the Azure Blob Storage emulator) and a container per test; one local SparkSession.

moto, obstore and Azurite are imported or started only when a test asks for these fixtures (the tests that
need them skip when they are not installed), so the rest of the suite neither waits for nor requires them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from support.azure import Azurite
    from support.proxy import FaultProxy
    from support.s3 import MotoS3


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One moto S3 server on 127.0.0.1 for the whole session (see tests/support/s3.py)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (it is in the dev extra)")
    pytest.importorskip("obstore", reason="obstore is not installed (it is in the dev and remote extras)")
    from support.s3 import MotoS3

    with MotoS3() as s3:
        yield s3


@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> Iterator[str]:
    """A fresh, empty bucket on the session's moto server, deleted after the test."""
    name = moto_s3.new_bucket()
    yield name
    moto_s3.delete_bucket(name)


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[FaultProxy]:
    """A fault-injecting, request-counting proxy in front of the moto server; ``s3_proxy.url`` is the
    endpoint to give a client (``moto_s3.storage_options(s3_proxy.url)``)."""
    from support.proxy import FaultProxy

    with FaultProxy(moto_s3.endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """One Azurite (Azure Blob Storage emulator) process on 127.0.0.1 for the whole session (see
    tests/support/azure.py)."""
    pytest.importorskip("obstore", reason="obstore is not installed (it is in the dev and remote extras)")
    from support.azure import Azurite, azurite_command

    if azurite_command() is None:
        pytest.skip("azurite-blob is not installed (make test installs it under .venv/node)")
    with Azurite() as az:
        yield az


@pytest.fixture
def az_container(azurite: Azurite) -> str:
    """A fresh, empty container on the session's Azurite (in memory: dropped with the process)."""
    return azurite.new_container()


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """One local SparkSession for the whole run, seqstore's data source registered: tests/test_spark.py's,
    and the one docs/distributed.md's example gets from ``SparkSession.builder...getOrCreate()``
    (tests/test_docs_examples.py), so the run starts one Spark context and one set of Spark's Python
    workers, not two. local[2,2]: two threads, a failed task is retried once (test_spark's retry tests)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import seqstore.spark

    active = SparkSession.getActiveSession()
    if active is not None:  # made elsewhere with other settings (no retries): this one is the run's
        active.stop()
    session = (
        SparkSession.builder.master("local[2,2]")  # 2 threads; a failed task is retried once
        .appName("seqstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(seqstore.spark.DataSource)
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def _forkserver_with_torch() -> None:
    """Start this run's forkserver (as seqstore's parallel conversions start it: Ctrl-C ignored) with torch
    and seqstore.torch imported, so that loader workers forked from it (``multiprocessing_context=
    "forkserver"``) do not each import torch. A user's script gets the same, as the server imports its
    ``__main__``, which imports torch."""
    if "forkserver" in __import__("multiprocessing").get_all_start_methods():
        from seqstore.interop._parallel import _context

        _context(["torch", "seqstore.torch"])


@pytest.fixture(scope="session", autouse=True)
def _short_dataloader_worker_joins() -> None:
    """torch's DataLoader iterator, once a worker raised, no longer reaches its workers with the final
    signal: when it is collected it waits ``MP_STATUS_CHECK_INTERVAL`` (5 s) for each worker to end, then
    kills them (torch 2.13, also without seqstore). Tests that check an error leave such iterators behind
    and paid 10 s each wherever the garbage collector happened to run; the wait is 0.2 s here (what is
    checked does not change: the workers are gone either way)."""
    try:
        import torch.utils.data._utils as torch_data_utils
    except ImportError:
        return
    torch_data_utils.MP_STATUS_CHECK_INTERVAL = 0.2


#: Tests that take several seconds each and repeat a check that a faster test of the default run makes along
#: another path (another back end, signal, node fault or loader mode): ``make test-slow`` runs them, with the
#: long scale tests, so that the default run stays under 15 minutes. Ids as pytest prints them under tests/.
LONG_VARIANTS = frozenset({
    "cluster/test_cluster.py::test_node_killed_mid_epoch_resumes_on_the_survivor",
    "cluster/test_cluster.py::test_object_store_restarted_mid_epoch",
    "cluster/test_cluster.py::test_link_cut_right_after_open_is_ridden_out",
    "cluster/test_cluster.py::test_slowdown_503_on_a_fraction_of_requests",
    "cluster/test_cluster.py::test_link_cut_mid_epoch_stalls_and_continues[host]",
    "test_spark.py::test_write_to_s3",  # (test_ray.py::test_write_to_s3 writes parts to S3 in the default run)
    "data/test_packing.py::test_concat_equals_numpy_concatenation_at_1e5_documents",
    "test_spark.py::test_write_errors_name_the_column",
    "test_spark.py::test_task_killed_mid_write_is_retried_exactly_once",
    "test_spark.py::test_failed_overwrite_with_another_schema_leaves_the_store_writable",
    "test_ray.py::test_create_onto_an_existing_store_prints_only_the_seqstore_error",
    "test_ray.py::test_write_task_killed_mid_write_is_retried_exactly_once",
    "test_remote_errors.py::test_exit_after_a_remote_error_with_requests_in_flight_keeps_its_status",
    "test_remote_errors.py::test_after_an_answer_a_refused_link_gets_the_whole_budget",
    "test_remote_retry_budget.py::test_an_outage_shorter_than_the_budget_is_ridden_out",
    "test_remote_failures.py::test_a_listing_through_a_silent_fsspec_endpoint_raises_a_named_error",
    "test_remote_failures.py::test_an_upload_to_a_silent_fsspec_endpoint_raises_a_named_error[256]",
    "test_remote_parts.py::test_convert_workers_to_s3",
    "test_remote_read.py::test_torch_loaders_with_helpers_read_small_batches_ahead[map]",
    "test_remote_read.py::test_seqdataset_at_its_default_prefetch_reads_in_runs_as_the_iterable_does[workers]",
    "test_remote_read.py::test_packed_batches_read_ahead_on_a_remote_store[procs]",
    "test_remote_read.py::test_packed_batches_read_only_the_token_field[procs]",
    "test_remote_read.py::test_a_block_shuffled_epoch_fetches_its_blocks_as_they_lie[ragged]",
    "test_remote_failures.py::test_an_upload_to_a_silent_fsspec_endpoint_raises_a_named_error[None]",
    "test_remote_evict.py::test_opening_cache_entries_while_another_process_evicts_them",
    "torch/test_torch_chooser.py::test_workers_of_a_loop_killed_by_sigkill_end",
    "test_remote_hostile.py::test_a_bad_answer_is_a_named_error_or_the_right_bytes[once-direct-trickle]",
    "test_remote_hostile.py::test_a_bad_answer_is_a_named_error_or_the_right_bytes[once-direct-silent]",
    "test_remote_hostile.py::test_a_bad_answer_is_a_named_error_or_the_right_bytes[once-obstore-silent]",
    "torch/test_torch_worker_errors.py::test_workers_end_quietly_after_a_refused_read",
    "torch/test_torch_run_buffers.py::test_run_buffers_go_when_the_loop_is_killed",
    "torch/test_torch_chooser.py::test_a_second_ctrl_c_while_the_workers_end_is_ignored_quietly",
    "torch/test_torch_direct.py::test_threads_a_second_ctrl_c_while_the_helpers_end_is_ignored_quietly",
    "interop/test_interop_parallel.py::test_a_failing_progress_callback_fails_the_conversion_instead_of_hanging",
    # SIGTERM and the double Ctrl-C: 20 trials each in test_interrupt_leaves_nothing_20_trials (slow as well)
    *(f"interop/test_interop_interrupts.py::test_interrupt_leaves_nothing[{c}-{how}]"
      for c in ("convert", "copy", "export") for how in ("double-sigint", "sigterm")),
})


@pytest.hookimpl(tryfirst=True)  # (before -m 'not slow' deselects)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.partition("tests/")[2] in LONG_VARIANTS:
            item.add_marker(pytest.mark.slow)
