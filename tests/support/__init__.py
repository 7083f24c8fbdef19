"""Test infrastructure shared by the tests and the benchmarks (not tests themselves).

- :mod:`support.s3`: moto's S3 server on loopback, buckets, storage options, uploads.
- :mod:`support.proxy`: a fault-injecting, request-counting HTTP proxy in front of an S3 endpoint.

Importable as ``support`` with ``tests/`` on ``sys.path`` (pytest puts it there for tests/conftest.py;
``bench/`` scripts insert it themselves). Nothing here imports seqstore: stores are set up on the
server with obstore/boto3 only, so the code under test never sets up its own test.
"""
