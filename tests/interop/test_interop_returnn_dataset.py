"""seqstore.interop.returnn.StoreDataset driven through RETURNN's own Dataset API (PyPI returnn)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from interop_testlib import make_store, write_returnn_hdf

import seqstore

pytest.importorskip("returnn")
from returnn.datasets.basic import Dataset  # noqa: E402

from seqstore.interop.returnn import StoreDataset, import_hdf  # noqa: E402

N = 1000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("ds")
    exp = make_store(root / "c.seqstore", n=N, seed=11)
    return root / "c.seqstore", exp


def _walk(ds: StoreDataset) -> tuple[list[str], list[np.ndarray]]:
    """One sub-epoch through RETURNN's iteration protocol: iterate_seqs, load_seqs, get_data, get_tag."""
    tags, datas = [], []
    for seq_idx, _start, _end in ds.iterate_seqs():
        ds.load_seqs(seq_idx, seq_idx + 1)
        tags.append(ds.get_tag(seq_idx))
        datas.append(ds.get_data(seq_idx, "data"))
        assert ds.get_seq_length(seq_idx)["data"] == len(datas[-1])
    return tags, datas


def test_interop_dataset_laplace_partition_shards_matches_seq_order(corpus: tuple[Path, dict]) -> None:
    path, exp = corpus
    lengths = np.asarray(exp["lengths"])
    full_epoch: list[int] = []
    for epoch in (1, 2, 3, 4):
        for shard in (0, 1):
            ds = StoreDataset(path=str(path), seq_ordering="laplace:.100", partition_epoch=3,
                              _num_shards=2, _shard_index=shard)
            ds.initialize()
            ds.init_seq_order(epoch=epoch)
            want = seqstore.seq_order(N, "laplace:.100", epoch=epoch, seed=0, lengths=lengths, partition_epoch=3,
                                      shard_index=shard, num_shards=2)
            tags, datas = _walk(ds)
            assert tags == [exp["tags"][i] for i in want]
            for d, i in zip(datas, want):
                np.testing.assert_array_equal(d, exp["data"][i])
            assert list(ds.get_current_seq_order()) == list(want)
            assert ds.num_seqs == len(want)
            if epoch <= 3:
                full_epoch += list(want)
    # the 3 sub-epochs x 2 shards of full epoch 1 cover every sequence once
    assert sorted(full_epoch) == list(range(N))


def test_interop_dataset_set_sharding_and_seed_offset(corpus: tuple[Path, dict]) -> None:
    path, exp = corpus
    ds = StoreDataset(path=str(path), seq_ordering="random", partition_epoch=2, random_seed_offset=5)
    ds.initialize()
    ds.set_sharding(num_shards=3, shard_index=2)
    ds.init_seq_order(epoch=4)
    want = seqstore.seq_order(N, "random", epoch=4, seed=5, partition_epoch=2, shard_index=2, num_shards=3)
    assert list(ds.get_current_seq_order()) == list(want)
    assert ds.get_corpus_seq_idx(0) == want[0]


@pytest.mark.parametrize("ordering", ["default", "reverse", "sorted", "sorted_reverse", "default_every_n:3"])
def test_interop_dataset_deterministic_orders_equal_returnn(corpus: tuple[Path, dict], ordering: str) -> None:
    """For deterministic orderings the sub-epoch/shard order equals RETURNN's own get_seq_order_for_epoch."""
    path, exp = corpus
    lengths = exp["lengths"]
    for epoch, shard in ((1, 0), (2, 1), (3, 0)):
        ds = StoreDataset(path=str(path), seq_ordering=ordering, partition_epoch=3, _num_shards=2, _shard_index=shard)
        ds.initialize()
        ds.init_seq_order(epoch=epoch)
        theirs = Dataset.get_seq_order_for_epoch(ds, epoch, N, get_seq_len=lambda i: int(lengths[i]))
        assert list(ds.get_current_seq_order()) == list(theirs)


def test_interop_dataset_fixed_random_seed(corpus: tuple[Path, dict]) -> None:
    path, _ = corpus
    orders = []
    for epoch in (1, 2, 4, 5):
        ds = StoreDataset(path=str(path), seq_ordering="random", partition_epoch=3, fixed_random_seed=42)
        ds.initialize()
        ds.init_seq_order(epoch=epoch)
        orders.append(list(ds.get_current_seq_order()))
    full = seqstore.seq_order(N, "random", epoch=1, seed=42)
    assert orders[0] + orders[1] == list(full[: len(orders[0]) + len(orders[1])])
    assert orders[0] == orders[2] and orders[1] == orders[3]  # the same order every full epoch


def test_interop_dataset_api_surface(corpus: tuple[Path, dict]) -> None:
    path, exp = corpus
    ds = StoreDataset(path=str(path), seq_ordering="default", name="train")
    ds.initialize()
    assert ds.supports_sharding() and ds.supports_seq_order_sorting()
    assert ds.get_data_keys() == ["data", "classes", "speaker"]
    assert ds.get_target_list() == ["classes", "speaker"]
    assert ds.num_outputs["data"] == (3, 2) and ds.get_data_shape("data") == [3]
    assert ds.is_data_sparse("classes") and not ds.is_data_sparse("data") and ds.is_data_sparse("speaker")
    assert ds.get_data_dtype("classes") == "int64"
    assert ds.get_total_num_seqs() == N
    assert ds.get_num_timesteps() == int(np.sum(exp["lengths"]))
    tags = ds.get_all_tags()
    assert not isinstance(tags, list) and len(tags) == N and tags[17] == exp["tags"][17] and tags[-1] == exp["tags"][-1]
    ds.init_seq_order(epoch=1)
    np.testing.assert_array_equal(ds.get_data(5, "speaker"), [exp["speaker"][5]])
    np.testing.assert_array_equal(ds.get_data(5, "classes"), exp["classes"][5])
    seq = ds.get_corpus_seq(7)
    assert seq.seq_tag == exp["tags"][7]
    np.testing.assert_array_equal(seq.features["data"], exp["data"][7])
    assert ds.get_estimated_seq_length(3) == exp["lengths"][3]
    # explicit orders (RETURNN's seq_list / seq_order) are used as given
    ds.init_seq_order(epoch=2, seq_list=[exp["tags"][9], exp["tags"][2]])
    assert list(ds.get_current_seq_order()) == [9, 2] and ds.get_tag(1) == exp["tags"][2]
    ds.init_seq_order(epoch=2, seq_order=[4, 4, 1])
    assert ds.num_seqs == 3 and ds.get_tag(2) == exp["tags"][1]
    with pytest.raises(KeyError, match="no data key"):
        ds.get_data(0, "nope")


def test_interop_dataset_open_is_lazy_and_cache_shared(tmp_path: Path) -> None:
    from seqstore.data import StoreDataset as DataStoreDataset

    make_store(tmp_path / "c.seqstore", n=50)
    ds = StoreDataset(path=str(tmp_path / "c.seqstore"), seq_ordering="laplace:.10")
    ds.initialize()  # RETURNN's initialize calls init_seq_order(None): nothing computed yet
    assert not (tmp_path / "c.seqstore.cache").exists()
    ds.init_seq_order(epoch=1)  # laplace gathers each bin's lengths lazily: nothing is written
    assert not (tmp_path / "c.seqstore.cache").exists()
    assert sorted(ds.get_current_seq_order()) == list(range(50))
    ds1 = StoreDataset(path=str(tmp_path / "c.seqstore"), seq_ordering="sorted")
    ds1.init_seq_order(epoch=1)
    first = list(ds1.get_current_seq_order())  # the sort index is built on first use
    # the data layer's cache files: the same ones seqstore.data (and seqstore.torch) map for this field
    cache = tmp_path / "c.seqstore.cache"
    data_view = DataStoreDataset(tmp_path / "c.seqstore", length_field="data")
    lengths = data_view.lengths_array()
    assert isinstance(lengths, np.memmap) and Path(lengths.filename).parent == cache
    sort_file = data_view._sort_cache()
    assert sort_file is not None and sort_file.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted([Path(lengths.filename).name, sort_file.name])
    assert first == list(np.argsort(np.asarray(lengths), kind="stable"))
    ds2 = StoreDataset(path=str(tmp_path / "c.seqstore"), seq_ordering="sorted", cache_dir=str(tmp_path / "cc"))
    ds2.initialize()
    ds2.init_seq_order(epoch=1)
    assert ds2.get_tag(0)  # the sort index is built on first use
    assert len(list((tmp_path / "cc").glob("*.npy"))) == 2  # lengths + sort index
    # a changed store gets a new cache file (fingerprint over the shards)
    with seqstore.append_to(tmp_path / "c.seqstore") as w:
        w.append_batch({"data": [np.zeros((2, 3), "float32")], "classes": [np.zeros(1, "int64")],
                        "speaker": np.zeros(1, "int32")}, ids=["new"])
    ds3 = StoreDataset(path=str(tmp_path / "c.seqstore"), seq_ordering="sorted_reverse")
    ds3.init_seq_order(epoch=1)
    assert len(list(cache.glob("lengths-*.npy"))) == 2
    assert sorted(ds3.get_current_seq_order()) == list(range(51))


def test_interop_dataset_unwritable_cache_falls_back_to_memory(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    exp = make_store(tmp_path / "c.seqstore", n=30)
    (tmp_path / "file").write_text("not a directory")
    for ordering in ("sorted", "sort_bin_shuffle:3"):
        ds = StoreDataset(path=str(tmp_path / "c.seqstore"), seq_ordering=ordering,
                          cache_dir=str(tmp_path / "file" / "cache"))
        with caplog.at_level("WARNING"):
            ds.init_seq_order(epoch=1)
        assert "computing lengths in memory" in caplog.text
        order = list(ds.get_current_seq_order())
        assert sorted(order) == list(range(30))
        if ordering == "sorted":
            assert order == list(np.argsort(exp["lengths"], kind="stable"))
    ds = StoreDataset(path=str(tmp_path / "c.seqstore"), seq_ordering="laplace:.5",
                      cache_dir=str(tmp_path / "file" / "cache"))
    ds.init_seq_order(epoch=2)  # laplace needs no cache at all
    assert sorted(ds.get_current_seq_order()) == list(range(30))


def test_interop_dataset_pickles_by_path(corpus: tuple[Path, dict]) -> None:
    path, _ = corpus
    ds = StoreDataset(path=str(path), seq_ordering="laplace:.100", partition_epoch=3)
    ds.initialize()
    ds.set_sharding(num_shards=2, shard_index=1)
    ds.init_seq_order(epoch=2)
    blob = pickle.dumps(ds)
    assert len(blob) < 2000
    back = pickle.loads(blob)
    assert back.epoch == 2 and back._num_shards == 2 and back._shard_index == 1
    assert list(back.get_current_seq_order()) == list(ds.get_current_seq_order())
    assert back.get_tag(0) == ds.get_tag(0)


def test_interop_dataset_unsupported_options(corpus: tuple[Path, dict]) -> None:
    path, _ = corpus
    with pytest.raises(ValueError, match="repeat_epoch"):
        StoreDataset(path=str(path), repeat_epoch=2)
    with pytest.raises(ValueError, match="unique_seq_tags"):
        StoreDataset(path=str(path), unique_seq_tags=True)


def test_interop_dataset_torch_pipeline_workers(corpus: tuple[Path, dict]) -> None:
    """RETURNN's PyTorch wrapper in a DataLoader with 2 workers: the dataset is pickled to each worker,
    RETURNN shards it per worker, and together the workers yield exactly the sub-epoch's sequences."""
    torch = pytest.importorskip("torch")
    from returnn.torch.data.returnn_dataset_wrapper import ReturnnDatasetIterDataPipe

    path, exp = corpus
    ds = StoreDataset(path=str(path), seq_ordering="laplace:.100", partition_epoch=3)
    ds.initialize()
    pipe = ReturnnDatasetIterDataPipe(ds, shard_workers=True)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    got = sorted(str(np.asarray(x["seq_tag"]).item()) for x in loader)
    want = seqstore.seq_order(N, "laplace:.100", epoch=1, seed=0, lengths=exp["lengths"], partition_epoch=3)
    assert got == sorted(exp["tags"][i] for i in want)


def test_interop_dataset_on_imported_hdf(tmp_path: Path) -> None:
    """The num_outputs and labels RETURNN's HDFDataset reports come back through StoreDataset."""
    from returnn.datasets.hdf import HDFDataset

    write_returnn_hdf(tmp_path / "a.hdf", n=20, dim=None, vocab=30)
    import_hdf(tmp_path / "a.hdf", tmp_path / "a.seqstore")
    ref = HDFDataset(files=[str(tmp_path / "a.hdf")])
    ref.initialize()
    ref.init_seq_order(epoch=1)
    ds = StoreDataset(path=str(tmp_path / "a.seqstore"))
    ds.initialize()
    ds.init_seq_order(epoch=1)
    assert {k: tuple(v) for k, v in ref.num_outputs.items()} == ds.num_outputs
    for k in ref.get_data_keys():
        assert ref.is_data_sparse(k) == ds.is_data_sparse(k) and ref.get_data_dtype(k) == ds.get_data_dtype(k)
    for i in range(20):
        assert ref.get_tag(i) == ds.get_tag(i)
        for k in ref.get_data_keys():
            np.testing.assert_array_equal(ref.get_data(i, k), ds.get_data(i, k))


@pytest.mark.parametrize("streams", [{"x": {"dim": "abc"}}, {"x": {"dim": 3, "ndim": None}}, {"x": {"dim": 2.5}}])
def test_interop_dataset_malformed_returnn_metadata_is_a_named_error(tmp_path: Path, streams: dict) -> None:
    """A dim in the store's metadata["returnn"]["streams"] that is not a whole number was a bare
    ValueError/TypeError from int() (2.5 was taken as 2); it is a SchemaError naming the store and field."""
    with seqstore.create(tmp_path / "s", {"x": seqstore.Field("int32", (None,))},
                         metadata={"returnn": {"streams": streams}}) as w:
        w.append({"x": np.arange(3, dtype=np.int32)})
    with pytest.raises(seqstore.SchemaError, match=r"metadata\['returnn'\]\['streams'\]\['x'\] .* whole numbers"):
        StoreDataset(str(tmp_path / "s"))


@pytest.mark.parametrize("given", [5, (2.5, 1), ("a", 1), (3,), None])
def test_interop_dataset_num_outputs_not_two_whole_numbers_is_a_value_error(tmp_path: Path, given: object) -> None:
    """num_outputs={key: value} with a value that is not (dim, ndim) was a bare TypeError/ValueError from
    indexing or int() (and (2.5, 1) was taken as (2, 1))."""
    with seqstore.create(tmp_path / "s", {"x": seqstore.Field("int32", (None,))}) as w:
        w.append({"x": np.arange(3, dtype=np.int32)})
    with pytest.raises(ValueError, match=r"num_outputs\['x'\] must be \(dim, ndim\), two whole numbers >= 0"):
        StoreDataset(str(tmp_path / "s"), num_outputs={"x": given})


@pytest.mark.parametrize("labels", [5, "abc", [1, 2], {"a": 1}])
def test_interop_returnn_labels_not_a_list_of_strings_is_a_named_error(tmp_path: Path, labels: object) -> None:
    """metadata["returnn"]["labels"][field] that is not a list of strings was a bare TypeError from list()
    (and a string was taken as its letters); StoreDataset and export_hdf name the store, field and what
    was expected."""
    with seqstore.create(tmp_path / "s", {"data": seqstore.Field("int32", (None,))},
                         metadata={"returnn": {"labels": {"data": labels}}}) as w:
        w.append({"data": np.arange(3, dtype=np.int32)})
    want = r"metadata\['returnn'\]\['labels'\]\['data'\] .*expected a list of strings"
    with pytest.raises(seqstore.SchemaError, match=want):
        StoreDataset(str(tmp_path / "s"))
    from seqstore.interop.returnn import export_hdf

    with pytest.raises(seqstore.SchemaError, match=want):
        export_hdf(tmp_path / "s", tmp_path / "r.hdf")
    assert not (tmp_path / "r.hdf").exists()
