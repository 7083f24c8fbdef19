"""Test infrastructure shared by the tests and the benchmarks (not tests themselves).

- :mod:`support.s3`: moto's S3 server on loopback, buckets, storage options, uploads.
- :mod:`support.proxy`: a fault-injecting, request-counting HTTP proxy in front of an S3 endpoint.
- :mod:`support.stores`: small local stores with every kind of field, and value-for-value comparisons.
- :mod:`support.cluster`: hosts in network namespaces on a switch (root only), for multi-node tests;
  :mod:`support.cluster_storage` is the object store they run on their storage host.
- :mod:`support.jobs`: conversion jobs for ``interop._parallel``'s worker processes (one that kills its worker).

Importable as ``support`` with ``tests/`` on ``sys.path`` (pytest puts it there for tests/conftest.py;
``bench/`` scripts insert it themselves). s3 and proxy do not import seqstore: objects are put on the
server with obstore/boto3, so seqstore's remote code never sets up its own test (stores.py writes the
local reference stores with seqstore's local writer).
"""
