"""Interop with other data formats: RETURNN HDF import/export and a RETURNN dataset over a store
(:mod:`seqstore.interop.returnn`), Arrow/Parquet import (:mod:`seqstore.interop.arrow`), Hugging Face
``datasets`` import (:mod:`seqstore.interop.hf`), Lhotse cut manifests (:mod:`seqstore.interop.lhotse`),
Megatron and WebDataset (:mod:`~seqstore.interop.megatron`, :mod:`~seqstore.interop.webdataset`), records
as Arrow arrays for the engines' readers (:mod:`seqstore.interop.to_arrow`), the one importer driver every
import goes through (:mod:`seqstore.interop.driver`; worker processes in :mod:`seqstore.interop._parallel`),
and the ``seqstore convert`` / ``seqstore export`` subcommands (:mod:`seqstore.interop.commands`).

Optional dependencies are imported where they are used: ``h5py`` (extra ``hdf5``) for HDF,
``pyarrow`` (extra ``arrow``) for Arrow/Parquet, ``datasets`` (extra ``hf``), RETURNN only for
``StoreDataset``, ``lhotse`` only for its import.
"""

from ._common import SourceFormatError

__all__ = ["SourceFormatError"]
